from __future__ import annotations

import pytest

from msgtable.errors import InvalidArgument, PermissionDenied, Unauthenticated
from msgtable.server.auth import Authorizer

TOKEN = "a-token-long-enough-1"
RULES = {
    "tokens": {TOKEN: "billing"},
    "certificates": {"worker-1": "billing"},
    "allow": [
        {"principal": "billing", "tables": ["invoice_*"], "actions": ["subscribe", "ack"]},
        {"principal": "*", "tables": ["public"], "actions": ["list"]},
    ],
}


def test_a_bearer_token_or_a_certificate_name_is_a_principal():
    a = Authorizer.from_dict(RULES)
    assert a.authenticate([("authorization", f"Bearer {TOKEN}")], []) == "billing"
    assert a.authenticate([("Authorization", f"bearer {TOKEN}".encode())], []) == "billing"
    assert a.authenticate([], ["worker-1"]) == "billing"
    for metadata, names in (
        ([], []),
        ([], ["someone-else"]),
        ([("authorization", "Bearer wrong-token-of-some-length")], ["worker-1"]),
        ([("authorization", f"Basic {TOKEN}")], []),
        ([("authorization", "Bearer ")], []),
    ):
        with pytest.raises(Unauthenticated):
            a.authenticate(metadata, names)


def test_rules_allow_by_principal_table_pattern_and_action_and_deny_the_rest():
    a = Authorizer.from_dict(RULES)
    assert a.allows("billing", "subscribe", "invoice_in")
    assert a.allows("billing", "ack", "invoice_out")
    assert not a.allows("billing", "list", "invoice_in")
    assert not a.allows("billing", "subscribe", "payroll")
    assert a.allows("anyone", "list", "public") and not a.allows("anyone", "ack", "public")
    with pytest.raises(PermissionDenied, match="billing may not ack table 'payroll'"):
        a.check("billing", "ack", "payroll")


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        ({"users": {}}, "unknown section 'users'"),
        ({"tokens": {"short": "x"}}, "at least 16 characters"),
        ({"tokens": {TOKEN: ""}}, r"\[tokens\] maps strings"),
        ({"allow": [{"principal": "x", "tables": ["t"], "actions": ["drop"]}]}, "actions must"),
        ({"allow": [{"principal": "x", "tables": [], "actions": ["ack"]}]}, "tables must"),
        ({"allow": [{"tables": ["t"], "actions": ["ack"]}]}, "principal must"),
        ({"allow": [{"principal": "x", "tables": ["t"], "actions": ["ack"], "y": 1}]}, "'y'"),
    ],
)
def test_a_bad_auth_file_says_what_is_wrong(doc, error):
    with pytest.raises(InvalidArgument, match=error):
        Authorizer.from_dict(doc)


def test_an_auth_file_is_toml(tmp_path):
    f = tmp_path / "auth.toml"
    f.write_text(
        f'[tokens]\n"{TOKEN}" = "billing"\n\n[[allow]]\nprincipal = "billing"\n'
        'tables = ["*"]\nactions = ["list"]\n'
    )
    assert Authorizer.from_file(f).allows("billing", "list", "t")
    f.write_text("[tokens\n")
    with pytest.raises(InvalidArgument, match="not valid TOML"):
        Authorizer.from_file(f)
    with pytest.raises(InvalidArgument, match="cannot read"):
        Authorizer.from_file(tmp_path / "missing.toml")
