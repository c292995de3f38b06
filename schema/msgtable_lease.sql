-- The lease table: which of the msgtable servers on this database sends its messages
-- (README: Several servers, one database). msgtable creates it on first start when its
-- user may CREATE; otherwise create it once with this file and grant the server's user
-- SELECT, INSERT, UPDATE on it. One row; msgtable writes it, nobody else should.
CREATE TABLE IF NOT EXISTS msgtable_lease (
  name VARCHAR(64) NOT NULL,
  holder VARCHAR(64) NOT NULL,
  address VARCHAR(255) NOT NULL,
  expires DATETIME(6) NOT NULL,
  released TINYINT NOT NULL DEFAULT 0,
  PRIMARY KEY (name)
) COMMENT='msgtable: which server sends this database''s messages';
