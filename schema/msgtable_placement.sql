-- The placement table: which of the msgtable servers on this database sends which message
-- table (README: Several servers, one database). msgtable creates it on first start when
-- its user may CREATE; otherwise create it once with this file and grant the server's user
-- SELECT, INSERT, UPDATE, DELETE on it. A row per server (its presence) and per table it
-- sends (its lease); msgtable writes it, nobody else should.
CREATE TABLE IF NOT EXISTS msgtable_placement (
  kind VARCHAR(16) NOT NULL,
  name VARCHAR(64) NOT NULL,
  holder VARCHAR(64) NOT NULL,
  address VARCHAR(255) NOT NULL,
  expires DATETIME(6) NOT NULL,
  released TINYINT NOT NULL DEFAULT 0,
  PRIMARY KEY (kind, name)
) COMMENT='msgtable: which server sends which message table of this database';
