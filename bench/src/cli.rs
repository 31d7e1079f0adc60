//! The command line, `phone-bench run [options]` (see the usage in
//! `main`), parsed into `Opts`; and the URL of a database of the bench's
//! PostgreSQL.

use std::{collections::BTreeSet, path::PathBuf};

pub(crate) struct Opts {
    pub(crate) quick: bool,
    pub(crate) pg_port: u16,
    pub(crate) pg_dir: PathBuf,
    pub(crate) pg_bin: PathBuf,
    pub(crate) out: PathBuf,
    pub(crate) command: String,
    pub(crate) pool_size: usize,
    pub(crate) base_port: u16,
    pub(crate) only: Option<BTreeSet<String>>,
}

pub(crate) fn parse_args() -> Result<Opts, String> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("run") => {}
        other => return Err(format!("expected the `run` command, got {other:?}")),
    }
    let mut o = Opts {
        quick: false,
        pg_port: 25432,
        pg_dir: PathBuf::from("data/bench-pg"),
        pg_bin: find_pg_bin().unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin")),
        out: PathBuf::from("bench/RESULTS.md"),
        command: "phone-bench run".into(),
        pool_size: 16,
        base_port: 3101,
        only: None,
    };
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--quick" => o.quick = true,
            "--pg-port" => o.pg_port = value()?.parse().map_err(|e| format!("--pg-port: {e}"))?,
            "--pg-dir" => o.pg_dir = PathBuf::from(value()?),
            "--pg-bin" => o.pg_bin = PathBuf::from(value()?),
            "--out" => o.out = PathBuf::from(value()?),
            "--command" => o.command = value()?.trim().to_owned(),
            "--pool-size" => {
                o.pool_size = value()?.parse().map_err(|e| format!("--pool-size: {e}"))?
            }
            "--base-port" => {
                o.base_port = value()?.parse().map_err(|e| format!("--base-port: {e}"))?
            }
            "--only" => o.only = Some(value()?.split(',').map(|s| s.trim().to_owned()).collect()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

fn find_pg_bin() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("pgbench").exists().then_some((v, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, p)| p)
}

pub(crate) fn pg_url(opts: &Opts, database: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{}/{database}", opts.pg_port)
}
