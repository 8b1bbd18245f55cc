-- bench_real.py workload: sqlite3 building a 500,000-row table, three indexes and a grouped table.
CREATE TABLE t(a INTEGER, b TEXT, c REAL);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500000)
INSERT INTO t SELECT i, printf('name-%d-%s', i, hex(randomblob(8))), i * 0.25 FROM n;
CREATE INDEX t_b ON t(b);
CREATE INDEX t_c ON t(c, a);
CREATE TABLE u AS SELECT a % 1000 AS k, count(*) AS n, group_concat(b) AS names FROM t GROUP BY a % 1000;
CREATE INDEX u_k ON u(k);
SELECT count(*), sum(length(names)) FROM u;
