-- Shared rate-limit counters (fixed windows), so limits hold across
-- replicas. Unlogged: after a crash the counters start again at zero.
CREATE UNLOGGED TABLE rate_limits (
    bucket       text PRIMARY KEY,
    window_start timestamptz NOT NULL,
    hits         integer NOT NULL
);
