"""Dead letters across the tables of one database: where each table's dead messages are,
listing and counting them, and redriving them (the rules: msgtable.core.deadletters; the
SQL: msgtable.store.deadletters).

A table's dead messages are dead in place (time_dead set in the table), or moved into its
vt_dead_letter table; a table that is some table's dead-letter table holds that table's
dead letters; a subscription's are dead in place in its state table. Redrive moves a batch
back as fresh messages, in one transaction: into the table they came from (or the one
named), or, in place, into the same table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from msgtable.core.deadletters import DeadLetter, RedriveBatch, check_dead_letter, redrive_problem
from msgtable.core.ids import coerce_ids
from msgtable.core.tables import TableConfig
from msgtable.engine.manager import MessageManager
from msgtable.errors import InvalidArgument, TableLoadError
from msgtable.store.mysqlstore import Store


class DeadLetters:
    """The dead letters of the tables loaded now (see the module docstring): ``configs()``
    gives every loaded config, ``loaded(name)`` the manager of one (None: not loaded)."""

    def __init__(
        self,
        store: Store,
        configs: Callable[[], list[TableConfig]],
        loaded: Callable[[str], MessageManager | None],
        now_ns: Callable[[], int],
    ) -> None:
        self._store = store
        self._configs = configs
        self._loaded = loaded
        self._now_ns = now_ns

    def of(self, cfg: TableConfig) -> tuple[TableConfig, TableConfig | None]:
        """Where the dead messages of ``cfg`` are: (the table, its dead-letter table or None
        for in place). A table that is some table's dead-letter table holds dead letters
        itself: (that table, it)."""
        if cfg.dead_letter:
            dead = self.dead_letter_config(cfg)
            if dead is None:
                raise TableLoadError(
                    f"table {cfg.name}: vt_dead_letter={cfg.dead_letter}: that table is not loaded"
                )
            return cfg, dead
        sources = self._sources_of(cfg.name)
        if sources:
            return sources[0], cfg
        return cfg, None

    def dead_letter_config(self, cfg: TableConfig) -> TableConfig | None:
        """The loaded config of ``cfg``'s vt_dead_letter table (None: not loaded)."""
        m = self._loaded(cfg.dead_letter)
        return m.config if m is not None else None

    def _sources_of(self, dead_name: str) -> list[TableConfig]:
        configs = self._configs()
        return sorted((c for c in configs if c.dead_letter == dead_name), key=lambda c: c.name)

    def listed(
        self, cfg: TableConfig, name: str, after: object | None, limit: int
    ) -> tuple[list[DeadLetter], int]:
        """Up to ``limit`` dead messages of ``cfg`` (named ``name``) by id after ``after``,
        and how many there are."""
        table, dead = self.of(cfg)
        if after is not None:
            (after,) = coerce_ids(name, table.id_column, [after], "list after")
        rows = self._store.dead_letters(table, dead, after, limit)
        return rows, self._store.count_dead([(table, dead)])[table.name]

    def counted(self, configs: Sequence[TableConfig]) -> dict[str, int]:
        """How many dead messages each of ``configs`` holds, by table or state table (those
        whose dead-letter table just went are left out)."""
        pairs = []
        for cfg in configs:
            try:
                pairs.append(self.of(cfg))
            except TableLoadError:
                continue
        return self._store.count_dead(pairs)

    def redrive(
        self,
        cfg: TableConfig,
        to: str,
        target: TableConfig | None,
        subscription: str,
        ids: Sequence[object] | None,
        after: object | None,
        limit: int,
    ) -> RedriveBatch:
        """One batch of ``cfg``'s dead messages back (msgtable.engine.engine.MessageEngine's
        ``redrive``); ``target``: the loaded config of table ``to`` when it is another."""
        if cfg.dead_letter and not to and not subscription:
            source, dead = self.of(cfg)
            assert dead is not None
        else:
            dead, source = cfg, cfg
            if target is not None:
                source = target
            elif not to and not subscription:
                sources = self._sources_of(cfg.name)
                if len(sources) > 1:
                    names = ", ".join(s.name for s in sources)
                    raise InvalidArgument(
                        f"the dead letters of {cfg.name} come from {names}: say which with --to"
                    )
                if sources:
                    source = sources[0]
        problem = redrive_problem(dead, source)
        if problem:
            raise InvalidArgument(f"cannot redrive {dead.name} to {source.name}: {problem}")
        clean = coerce_ids(dead.name, dead.id_column, ids, "redrive") if ids else None
        if after is not None:
            (after,) = coerce_ids(dead.name, dead.id_column, [after], "redrive after")
        batch = self._store.redrive(dead, source, clean, after, limit, self._now_ns())
        if batch.moved:
            m = self._loaded(source.name)
            if m is not None:
                m.resync()
        return batch


def check_tables(configs: dict[str, TableConfig], errors: dict[str, str]) -> None:
    """Move tables whose vt_dead_letter table cannot take their dead messages from
    ``configs`` to ``errors`` (until none is left: a dead-letter table may fail for its own
    dead-letter table in turn)."""
    changed = True
    while changed:
        changed = False
        for name, cfg in list(configs.items()):
            if not cfg.dead_letter:
                continue
            dead = configs.get(cfg.dead_letter)
            problem = check_dead_letter(cfg, dead, errors.get(cfg.dead_letter))
            if problem:
                errors[name] = f"table {name}: {problem}"
                del configs[name]
                changed = True
