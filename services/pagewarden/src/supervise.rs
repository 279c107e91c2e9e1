//! What `up` does when a child exits on its own: a worker (prefill, decode) is restarted on the
//! ports it had, after a back-off that doubles with each restart, up to a limit; the rest of the
//! suite keeps serving meanwhile (the router answers 503 while no worker of a role is live, and
//! ends the streams that were on the dead worker with an error event and `[DONE]`). Any other
//! child's exit, or a worker past its limit, stops the suite.

use std::collections::HashMap;
use std::time::Duration;

use crate::children::{Listening, Spec};

/// Restarts of one worker before `up` gives up and stops the suite.
pub const MAX_RESTARTS: u32 = 5;
/// The first restart's wait; each next one doubles it, up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait before a restart.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Children `up` restarts when they die.
const RESTARTED: [&str; 2] = ["decode", "prefill"];

/// What to do about a child that exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Start it again after `after`; this is restart number `attempt` of [`MAX_RESTARTS`].
    Restart {
        /// The wait first.
        after: Duration,
        /// Which restart this is (1-based).
        attempt: u32,
    },
    /// Stop the suite, saying why.
    StopAll(String),
}

/// Restart counts per child.
#[derive(Debug, Default)]
pub struct Restarts {
    done: HashMap<String, u32>,
}

impl Restarts {
    /// Decides about `name`, which just exited, and counts the restart if there is one.
    pub fn decide(&mut self, name: &str) -> Decision {
        if !RESTARTED.contains(&name) {
            return Decision::StopAll(format!("{name} is not restarted by `up`"));
        }
        let done = self.done.entry(name.to_string()).or_insert(0);
        if *done >= MAX_RESTARTS {
            return Decision::StopAll(format!(
                "{name} died {} times; not restarting it again",
                *done + 1
            ));
        }
        *done += 1;
        let after = FIRST_BACKOFF
            .saturating_mul(1 << (*done - 1).min(16))
            .min(MAX_BACKOFF);
        Decision::Restart {
            after,
            attempt: *done,
        }
    }
}

/// `spec` with each `--*-addr` that asked for any free port (`:0`) pinned to the address the
/// child listened on (its start line's `grpc=`, `metrics=`, `transfer=`), so that a restarted
/// worker is where the router and its peers already look for it.
pub fn pinned(spec: &Spec, listening: &Listening) -> Spec {
    let mut args = spec.args.clone();
    for i in 1..args.len() {
        let key = match args[i - 1].as_str() {
            "--grpc-addr" => "grpc",
            "--metrics-addr" => "metrics",
            "--transfer-addr" => "transfer",
            _ => continue,
        };
        if args[i].ends_with(":0") {
            if let Some(addr) = listening.get(key) {
                args[i] = addr.clone();
            }
        }
    }
    Spec {
        args,
        ..spec.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn workers_restart_with_doubling_back_off_up_to_a_limit_and_others_stop_the_suite() {
        let mut r = Restarts::default();
        let mut waits = Vec::new();
        for _ in 0..MAX_RESTARTS {
            match r.decide("prefill") {
                Decision::Restart { after, .. } => waits.push(after.as_secs()),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(waits, vec![1, 2, 4, 8, 16]);
        assert!(matches!(r.decide("prefill"), Decision::StopAll(_)));
        assert_eq!(
            r.decide("decode"),
            Decision::Restart {
                after: FIRST_BACKOFF,
                attempt: 1
            },
            "each worker has its own count"
        );
        assert!(matches!(r.decide("router"), Decision::StopAll(_)));
        assert!(matches!(r.decide("auditor"), Decision::StopAll(_)));
    }

    #[test]
    fn a_restart_keeps_the_ports_it_had() {
        let spec = Spec {
            name: "decode".into(),
            program: PathBuf::from("/bin/decode"),
            args: [
                "--grpc-addr",
                "127.0.0.1:0",
                "--metrics-addr",
                "127.0.0.1:9",
                "--node-id",
                "d",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            env: vec![],
        };
        let listening: Listening = [("grpc", "127.0.0.1:4242"), ("metrics", "127.0.0.1:9")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let p = pinned(&spec, &listening);
        assert_eq!(p.args[1], "127.0.0.1:4242");
        assert_eq!(p.args[3], "127.0.0.1:9", "a fixed address stays");
        assert_eq!(p.args[5], "d");
    }
}
