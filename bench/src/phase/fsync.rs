//! `fsync`: how many 8 kB write + fdatasync pairs a second the disk under
//! the cluster takes (pg_test_fsync): the ceiling of durable commits that
//! do not share a WAL flush, printed in the mix's section.

use std::time::Instant;

use crate::cli::Opts;
use crate::db;
use crate::report::Report;

/// Notes the rate in `report.fsync`, or why there is none.
pub(crate) async fn run(opts: &Opts, report: &mut Report, t0: Instant) {
    match db::fdatasync_rate(&opts.pg_bin, &opts.pg_dir.with_extension("fsync-test")).await {
        Ok(rate) => {
            say!(t0, "pg_test_fsync: fdatasync {rate:.0}/s");
            report.fsync = Some(rate);
        }
        Err(e) => report.notes.push(format!("pg_test_fsync failed: {e}")),
    }
}
