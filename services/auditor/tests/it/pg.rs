//! A throwaway PostgreSQL server for the store suite and the outage test: initdb in a temp dir,
//! started on a free loopback port with its unix socket in the temp dir, stopped on drop (and
//! on demand, then started again on the same data and port). Fails (never skips) when the
//! server binaries are missing.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct TempPostgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    as_postgres: bool,
    pub url: String,
    _dir: tempfile::TempDir,
}

fn find_bin_dir() -> PathBuf {
    if let Ok(p) = std::env::var("PAGEWARDEN_PG_BIN") {
        let p = PathBuf::from(p);
        assert!(
            p.join("initdb").exists(),
            "PAGEWARDEN_PG_BIN={} has no initdb",
            p.display()
        );
        return p;
    }
    let mut candidates: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    candidates.sort();
    if let Some((_, bin)) = candidates.pop() {
        return bin;
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir);
        if p.join("initdb").exists() && p.join("pg_ctl").exists() {
            return p.to_path_buf();
        }
    }
    panic!(
        "PostgreSQL server binaries (initdb, pg_ctl) not found in /usr/lib/postgresql/*/bin or \
         on PATH: install the `postgresql` package (scripts/test.sh does) or set PAGEWARDEN_PG_BIN"
    );
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free loopback port")
}

impl TempPostgres {
    fn run(&self, program: &str, args: &[&str]) {
        let exe = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            // initdb and postgres refuse to run as root.
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let out = cmd
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn start() -> Self {
        let bin = find_bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("pagewarden-pg-")
            .tempdir()
            .expect("temp dir");
        let as_postgres = is_root();
        if as_postgres {
            let st = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(st.success(), "chown of the temp dir to postgres failed");
        }
        let data = dir.path().join("data");
        let port = free_port();
        let pg = TempPostgres {
            bin,
            data: data.clone(),
            port,
            as_postgres,
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            _dir: dir,
        };
        let data_s = data.to_string_lossy().to_string();
        pg.run(
            "initdb",
            &[
                "-D",
                &data_s,
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        pg.start_again();
        pg
    }

    /// Starts the server (again) on its data directory and port.
    pub fn start_again(&self) {
        let data = self.data.to_string_lossy().to_string();
        let sock = self._dir.path().to_string_lossy().to_string();
        let opts = format!(
            "-p {} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off",
            self.port
        );
        let log = self
            ._dir
            .path()
            .join("postgres.log")
            .to_string_lossy()
            .to_string();
        self.run(
            "pg_ctl",
            &[
                "-D", &data, "-o", &opts, "-l", &log, "-w", "-t", "30", "start",
            ],
        );
    }

    /// Stops the server the way an operator's restart does: every connection is cut, and it
    /// answers none until [`TempPostgres::start_again`].
    pub fn stop(&self) {
        let data = self.data.to_string_lossy().to_string();
        self.run("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"]);
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        let data = self.data.to_string_lossy().to_string();
        let exe = self.bin.join("pg_ctl");
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        let _ = cmd
            .args(["-D", &data, "-m", "immediate", "-w", "stop"])
            .output();
    }
}
