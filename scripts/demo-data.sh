#!/usr/bin/env bash
# `make demo-data`: a realistic message history to try the analytics views on
# (docs/ANALYTICS.md).
#
#   make demo-data                           100,000 messages over 60 days
#   DEMO_MESSAGES=10000000 make demo-data    10M (a few minutes per million)
#
# Without DATABASE_URL it (re)creates the database `phone_demo` on the
# private PostgreSQL of `make run` (./data/pg, port 25429). With DATABASE_URL
# it fills that database, which must not hold messages yet. The schema comes
# from the server's own migrations: the script builds the server and starts
# it once against the database, then stops it.
#
# Variables: DEMO_MESSAGES (100000), DEMO_DAYS (60), DEMO_SEED (0.42, the
# same seed gives the same history relative to its end), DEMO_END (now).
set -euo pipefail
cd "$(dirname "$0")/.."

messages=${DEMO_MESSAGES:-100000}
days=${DEMO_DAYS:-60}
seed=${DEMO_SEED:-0.42}
end=${DEMO_END:-now}
case "$messages" in ''|*[!0-9]*) echo "demo-data: DEMO_MESSAGES must be a number" >&2; exit 2;; esac
case "$days" in ''|*[!0-9]*|0) echo "demo-data: DEMO_DAYS must be a positive number" >&2; exit 2;; esac

if [ -z "${DATABASE_URL:-}" ]; then
    port=${PHONE_PG_PORT:-25429}
    scripts/pg.sh start data/pg "$port"
    admin=$(scripts/pg.sh url "$port" postgres)
    psql -q "$admin" -c "DROP DATABASE IF EXISTS phone_demo WITH (FORCE)" -c "CREATE DATABASE phone_demo" >/dev/null
    DATABASE_URL=$(scripts/pg.sh url "$port" phone_demo)
    echo "demo-data: database phone_demo in ./data/pg (port $port), recreated"
fi
export DATABASE_URL

# Migrate by starting the server once (refinery records what it applied, so
# a later `make run` against this database finds it up to date).
if [ "$(psql -tAq "$DATABASE_URL" -c "SELECT to_regclass('analytics.daily_messages') IS NOT NULL")" != t ]; then
    echo "demo-data: building the server to apply its migrations"
    cargo build --release --quiet --bin phone
    mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    PORT=$mport PHONE_BIND=127.0.0.1 RUST_LOG=warn ./target/release/phone &
    server=$!
    trap 'kill $server 2>/dev/null || true' EXIT
    for _ in $(seq 1 120); do
        curl -fsS "http://127.0.0.1:$mport/health" >/dev/null 2>&1 && break
        kill -0 $server 2>/dev/null || { echo "demo-data: the server exited; see above" >&2; exit 1; }
        sleep 0.5
    done
    kill $server
    wait $server 2>/dev/null || true
    trap - EXIT
fi

existing=$(psql -tAq "$DATABASE_URL" -c "SELECT count(*) FROM (SELECT 1 FROM messages LIMIT 1) m")
if [ "$existing" != 0 ]; then
    echo "demo-data: this database already holds messages; use an empty one (or unset DATABASE_URL)" >&2
    exit 1
fi

echo "demo-data: generating $messages messages over $days days"
started=$(date +%s)
psql -q -v ON_ERROR_STOP=1 -v messages="$messages" -v days="$days" -v seed="$seed" -v end_at="$end" \
    "$DATABASE_URL" <<'SQL'
-- One session, no parallel workers: setseed makes the history repeatable.
SET max_parallel_workers_per_gather = 0;
SET work_mem = '256MB';
SET synchronous_commit = off;
SELECT setseed(:seed) AS seeded \gset
SELECT :'end_at'::timestamptz AS end_at \gset

-- The roster: six projects with a team each, and three shared services
-- that everyone writes to. Some agents read their mail at once, some poll
-- rarely; two go offline and stop reading before the end; one unregisters.
CREATE TEMP TABLE roster (name text, project text, role text, description text);
INSERT INTO roster
SELECT r.role || '-' || p.project, p.project, r.role,
       replace(r.description, '%', p.project)
FROM unnest(ARRAY['atlas', 'billing', 'hassing', 'infra', 'research', 'support']) AS p (project)
CROSS JOIN (VALUES
    ('coordinator', 'Plans the % work, splits it into tasks and hands them out'),
    ('coder',       'Writes and refactors code for %: Rust, TypeScript, SQL'),
    ('reviewer',    'Reviews pull requests for %, checks tests and style'),
    ('tester',      'Runs the % test suites and reports failures with logs'),
    ('deployer',    'Builds and deploys % releases; rollbacks on request'),
    ('researcher',  'Finds papers, docs and prior art for % questions'),
    ('summarizer',  'Writes daily summaries of % threads for the humans')
) AS r (role, description)
WHERE random() < 0.85 OR r.role IN ('coordinator', 'coder');
INSERT INTO roster VALUES
    ('email',      'shared', 'service', 'Reads and sends email: invoices, receipts, newsletters, replies'),
    ('calendar',   'shared', 'service', 'Books meetings, finds free slots, sends invitations'),
    ('web-search', 'shared', 'service', 'Searches the web and returns sources with quotes');

INSERT INTO agents (name, description, project, token_hash, registered_at, updated_at)
SELECT name, description, project, sha256(convert_to('demo token of ' || name, 'UTF8')),
       :'end_at'::timestamptz - make_interval(days => :days) - random() * interval '20 days',
       :'end_at'::timestamptz - make_interval(days => :days)
FROM roster ORDER BY random();

-- Per agent: how much it starts conversations (Zipf-like), how fast it
-- reads (log-normal, median from seconds to an hour), and when it stopped.
CREATE TEMP TABLE demo_agents AS
SELECT a.id, a.name, a.project, ro.role,
       row_number() OVER (ORDER BY a.id) AS idx,
       CASE WHEN ro.role IN ('coordinator', 'service') THEN 3.0 ELSE 1.0 END
           / power(row_number() OVER (ORDER BY random()), 0.7)              AS weight,
       ln(CASE WHEN a.name = 'calendar' THEN 12 WHEN a.name = 'email' THEN 75 WHEN ro.role = 'service' THEN 25
               WHEN ro.role = 'deployer' THEN 600 WHEN ro.role = 'summarizer' THEN 1800
               ELSE 30 + random() * 240 END)                                  AS read_mu,
       NULL::timestamptz AS offline_since,
       NULL::timestamptz AS unregistered
FROM agents a JOIN roster ro USING (name);
UPDATE demo_agents SET offline_since = :'end_at'::timestamptz - interval '9 days 5 hours'
WHERE idx = (SELECT idx FROM demo_agents WHERE role = 'summarizer' ORDER BY idx LIMIT 1);
UPDATE demo_agents SET offline_since = :'end_at'::timestamptz - interval '2 days 3 hours'
WHERE idx = (SELECT idx FROM demo_agents WHERE role = 'researcher' ORDER BY idx LIMIT 1);
UPDATE demo_agents SET unregistered = :'end_at'::timestamptz - interval '12 days 7 hours'
WHERE idx = (SELECT idx FROM demo_agents WHERE role = 'tester' ORDER BY idx LIMIT 1);
UPDATE agents a SET unregistered_at = d.unregistered FROM demo_agents d WHERE d.id = a.id AND d.unregistered IS NOT NULL;

CREATE TEMP TABLE sampling AS
SELECT array_agg(id ORDER BY idx) AS ids,
       array_agg(project ORDER BY idx) AS projects,
       array_agg(read_mu ORDER BY idx) AS read_mus,
       -- lower bounds of each agent's slice of [0, 1): width_bucket picks one
       array_agg(coalesce(lower_bound, 0) ORDER BY idx) AS lower_bounds
FROM (SELECT idx, id, project, read_mu,
             sum(weight) OVER (ORDER BY idx ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                 / sum(weight) OVER () AS lower_bound
      FROM demo_agents) w;
CREATE TEMP TABLE project_members AS
SELECT project, array_agg(idx ORDER BY idx) AS members FROM demo_agents GROUP BY project;

-- Conversations: more of them as the weeks go by, mostly in working hours,
-- fewer at weekends. 45% get no reply; the others go back and forth.
CREATE TEMP TABLE threads AS
WITH raw AS (
    SELECT g AS thread_no,
           date_trunc('day', :'end_at'::timestamptz - make_interval(days => :days)
                             + make_interval(days => :days) * sqrt(random())) AS day,
           random() AS u_hour, random() AS u_minute, random() AS u_a, random() AS u_b,
           random() AS u_scope, random() AS u_len, random() AS u_subject
    FROM generate_series(1, ceil(:messages / 2.9 * 1.45)::bigint) g
), placed AS (
    SELECT r.*,
           r.day + CASE WHEN r.u_hour < 0.75 THEN interval '8 hours' + r.u_minute * interval '11 hours'
                        ELSE r.u_minute * interval '24 hours' END AS start_at,
           width_bucket(r.u_a, s.lower_bounds) AS a_idx
    FROM raw r, sampling s
    WHERE extract(isodow FROM r.day) < 6 OR r.u_scope < 0.35 OR r.u_scope > 0.9
), paired AS (
    SELECT p.*,
           CASE WHEN p.u_scope < 0.7 AND cardinality(pm.members) > 1
                THEN pm.members[1 + floor(p.u_b * cardinality(pm.members))::int]
                ELSE width_bucket(p.u_b, s.lower_bounds) END AS b_pick
    FROM placed p, sampling s, project_members pm
    WHERE pm.project = s.projects[p.a_idx]
)
SELECT p.thread_no, p.start_at, p.u_subject,
       p.a_idx,
       CASE WHEN p.b_pick = p.a_idx THEN p.a_idx % cardinality(s.ids) + 1 ELSE p.b_pick END AS b_idx,
       CASE WHEN p.u_len < 0.45 THEN 1 ELSE least(2 + floor(-ln(1 - random()) * 2.5)::int, 40) END AS n
FROM paired p, sampling s;

-- Every message of every conversation: the recipient reads after a
-- log-normal delay, the reply follows after a short think. Messages that
-- would come after the end, from an agent gone offline or unregistered, or
-- after a message nobody read, are not written.
CREATE TEMP TABLE generated AS
WITH steps AS (
    SELECT t.thread_no, t.start_at, t.u_subject, i,
           CASE WHEN i % 2 = 1 THEN t.a_idx ELSE t.b_idx END AS s_idx,
           CASE WHEN i % 2 = 1 THEN t.b_idx ELSE t.a_idx END AS r_idx,
           random() AS u1, random() AS u2, random() AS u3, random() AS u4, random() AS u_body
    FROM threads t, generate_series(1, t.n) AS i
), timed AS (
    SELECT st.*,
           exp(s.read_mus[st.r_idx] + 1.3 * sqrt(-2 * ln(1 - st.u1)) * cos(2 * pi() * st.u2)) AS read_secs,
           exp(ln(45) + 0.9 * sqrt(-2 * ln(1 - st.u3)) * cos(2 * pi() * st.u4))             AS think_secs
    FROM steps st, sampling s
), placed AS (
    SELECT ti.*,
           ti.start_at + make_interval(secs => coalesce(sum(ti.read_secs + ti.think_secs) OVER (
               PARTITION BY ti.thread_no ORDER BY ti.i
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)) AS sent_at
    FROM timed ti
), checked AS (
    SELECT pl.*, ds.id AS sender_id, dr.id AS recipient_id,
           pl.sent_at + make_interval(secs => pl.read_secs) AS would_read_at,
           pl.sent_at > :'end_at'::timestamptz
             OR pl.sent_at >= coalesce(ds.offline_since, ds.unregistered, 'infinity')
             OR pl.sent_at >= coalesce(dr.unregistered, 'infinity') AS impossible,
           pl.sent_at + make_interval(secs => pl.read_secs)
               < least(:'end_at'::timestamptz, coalesce(dr.offline_since, 'infinity')) AS gets_read,
           dr.role AS recipient_role
    FROM placed pl
    JOIN demo_agents ds ON ds.idx = pl.s_idx
    JOIN demo_agents dr ON dr.idx = pl.r_idx
), chained AS (
    SELECT c.*,
           bool_and(NOT c.impossible) OVER w AS possible_so_far,
           coalesce(bool_and(c.gets_read) OVER w_before, true) AS all_before_read
    FROM checked c
    WINDOW w AS (PARTITION BY c.thread_no ORDER BY c.i),
           w_before AS (PARTITION BY c.thread_no ORDER BY c.i ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
)
SELECT thread_no, i, sender_id, recipient_id, sent_at, u_subject, u_body, recipient_role,
       CASE WHEN gets_read THEN would_read_at END AS read_at
FROM chained
WHERE possible_so_far AND all_before_read;

-- Whole conversations, in random order (thread_no is independent of time),
-- up to the number of messages asked for.
CREATE TEMP TABLE kept AS
SELECT thread_no
FROM (SELECT thread_no, sum(count(*)) OVER (ORDER BY thread_no) AS upto FROM generated GROUP BY thread_no) t
WHERE upto <= :messages;

-- Ids in time order, as the live server assigns them.
CREATE TEMP TABLE numbered AS
SELECT g.*, (SELECT coalesce(max(id), 0) FROM messages) + row_number() OVER (ORDER BY g.sent_at, g.thread_no, g.i) AS id
FROM generated g JOIN kept USING (thread_no);
CREATE INDEX ON numbered (thread_no, i);
ANALYZE numbered;

INSERT INTO messages (id, sender_id, recipient_id, subject, body, reply_to, thread_id,
                      sent_at, read_at, delivery_count, acked_at)
SELECT n.id, n.sender_id, n.recipient_id,
       CASE WHEN n.i = 1 AND n.u_subject < 0.4
            THEN (ARRAY['Invoice for November', 'Failing test in CI', 'Review please', 'Deploy window',
                        'Sources for the report', 'Meeting next week', 'Customer question',
                        'Flaky integration test', 'Release notes', 'Access request'])[1 + floor(n.u_subject * 25)::int]
       END,
       -- Bodies are filler of realistic sizes (median ~200 bytes, a few long
       -- logs and diffs); no view reads them.
       CASE WHEN n.u_body < 0.03
            THEN repeat('log line: request handled in 12 ms, status 200, retries 0; ', 20 + floor(n.u_body * 3000)::int)
            ELSE substr(repeat('Please take a look at the attached summary and tell me what you think. '
                               'The numbers for last week are in, the deploy went out at noon, and two '
                               'tests are still flaky. I can pick this up tomorrow if that works. ', 3),
                        1 + floor(n.u_body * 97)::int,
                        40 + floor(exp(ln(160) + 0.7 * sqrt(-2 * ln(1 - n.u_body)) * cos(2 * pi() * n.u_subject)))::int)
       END,
       prev.id, first.id, n.sent_at, n.read_at,
       CASE WHEN n.read_at IS NULL THEN 0 WHEN n.u_body > 0.97 THEN 2 ELSE 1 END,
       CASE WHEN n.recipient_role = 'deployer' THEN n.read_at END
FROM numbered n
JOIN numbered first ON first.thread_no = n.thread_no AND first.i = 1
LEFT JOIN numbered prev ON prev.thread_no = n.thread_no AND prev.i = n.i - 1
ORDER BY n.id;

-- The words a send stores for search (store::fragments::stored_words).
UPDATE messages SET words = setweight(to_tsvector('english'::regconfig, coalesce(subject, '')), 'A') ||
                            setweight(to_tsvector('english'::regconfig, body), 'B')
WHERE words IS NULL AND (group_id IS NULL OR group_id = id);

SELECT setval('messages_id_seq', greatest((SELECT max(id) FROM messages), 1)) AS last_id \gset

-- Presence: last seen at the agent's last send or read.
UPDATE agents a SET last_seen_at = x.seen
FROM (SELECT agent, max(at) AS seen
      FROM (SELECT sender_id AS agent, sent_at AS at FROM messages
            UNION ALL SELECT recipient_id, read_at FROM messages WHERE read_at IS NOT NULL) e
      GROUP BY agent) x
WHERE x.agent = a.id;
SQL
psql -q "$DATABASE_URL" -c "VACUUM (ANALYZE) agents, messages"
summary=$(psql -tAq "$DATABASE_URL" -c "SELECT format('%s agents, %s messages from %s to %s', (SELECT count(*) FROM agents), count(*), min(sent_at)::date, max(sent_at)::date) FROM messages")
echo "demo-data: $summary in $(( $(date +%s) - started )) s"
echo "demo-data: explore it with  psql '$DATABASE_URL'  and  SELECT * FROM analytics.daily_messages;"
