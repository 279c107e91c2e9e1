//! The one configuration layer of every service: command-line flags over environment variables
//! over a TOML file over defaults.
//!
//! Each service declares its settings once, as a clap struct whose fields are all optional and
//! which is also the shape of its TOML file (serde, unknown keys refused). [`layered`] reads the
//! file, then `PAGEWARDEN_<SERVICE>_<KEY>` variables for the struct's own keys, then the flags
//! actually given, and extracts the same struct again; the service then fills what is still unset
//! with its defaults. Durations are written one way everywhere, humantime's: `500ms`, `30s`,
//! `5m`, `1h 30m`.

use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::Value;
use figment::Figment;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::tenants::TenantsError;
use crate::tls::TlsError;

/// Settings that could not be read, or that do not make a usable configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A key of the file, the environment or the flags is unknown or of the wrong type.
    #[error("invalid configuration (read from {from}): {problem}")]
    Layers {
        /// The layers read, as a user would look for them.
        from: String,
        /// What was wrong, and where figment could tell.
        problem: Box<figment::Error>,
    },
    /// Flags, environment and file together name no model.
    #[error("no model: pass --model PATH (or env PAGEWARDEN_MODEL) or --tiny-test-model SEED")]
    NoModel,
    /// A size that must be positive was zero.
    #[error("{field} must be greater than zero")]
    Zero {
        /// The flag or key.
        field: &'static str,
    },
    /// The internal TLS files are incomplete or unreadable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A tenants or keys file named by the configuration could not be used.
    #[error(transparent)]
    Tenants(#[from] TenantsError),
    /// Any other value that is wrong, or missing.
    #[error("{0}")]
    Invalid(String),
}

/// Where a service's model (weights, or only tokenizer and chat template) comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A GGUF file.
    File(PathBuf),
    /// The seeded tiny random Llama that tests write themselves.
    TinyTest(u64),
}

impl ModelSource {
    /// The test model when a seed is given, else the file; neither is [`ConfigError::NoModel`].
    pub fn pick(tiny_test_model: Option<u64>, model: Option<PathBuf>) -> Result<Self, ConfigError> {
        match (tiny_test_model, model) {
            (Some(seed), _) => Ok(ModelSource::TinyTest(seed)),
            (None, Some(path)) => Ok(ModelSource::File(path)),
            (None, None) => Err(ConfigError::NoModel),
        }
    }
}

/// `v`, or [`ConfigError::Zero`] naming `field` when it is 0.
pub fn nonzero(field: &'static str, v: usize) -> Result<usize, ConfigError> {
    if v == 0 {
        return Err(ConfigError::Zero { field });
    }
    Ok(v)
}

/// For `#[serde(skip_serializing_if = "is_false")]` on a plain clap switch: a switch left off
/// is not a value, so it does not hide the file's or the environment's `true`.
pub fn is_false(b: &bool) -> bool {
    !*b
}

/// `#[serde(with = "pagewarden_common::config::text")]` for an optional setting whose type is
/// written as text (`Display` and `FromStr`, as clap parses it), in the file and the environment.
pub mod text {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the value as its `Display` text.
    pub fn serialize<T: Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    /// Reads the value from text with `FromStr`.
    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        Option::<String>::deserialize(d)?
            .map(|s| s.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Merges `file` (if any), then the environment variables `{env_prefix}{KEY}` for `T`'s keys,
/// then the values `flags` holds, each over the one before, into a `T`.
///
/// `flags` is the parsed command line: fields that are `None`, empty lists or switches left off
/// were not given and leave the layers below as they are. The field `config` (the file's own
/// path) is never a key. Unknown file keys are an error; environment variables that name no key
/// are not looked at (the environment is shared with everything else on the machine).
pub fn layered<T>(flags: &T, file: Option<&Path>, env_prefix: &str) -> Result<T, ConfigError>
where
    T: clap::Args + Serialize + DeserializeOwned,
{
    let mut from = vec!["flags".to_string(), format!("env {env_prefix}*")];
    let mut figment = Figment::new();
    if let Some(path) = file {
        from.push(path.display().to_string());
        std::fs::File::open(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        figment = figment.merge(Toml::file_exact(path));
    }
    let keys = keys_of::<T>();
    figment = figment
        .merge(Env::prefixed(env_prefix).filter(move |k| keys.iter().any(|key| k == key.as_str())));
    let layers = |problem: figment::Error| ConfigError::Layers {
        from: from.join(", "),
        problem: Box::new(problem),
    };
    let given = given(Value::serialize(flags).map_err(layers)?);
    figment
        .merge(Serialized::defaults(given))
        .extract()
        .map_err(layers)
}

/// The keys of `T`: its clap arguments' ids, which are its field names.
fn keys_of<T: clap::Args>() -> Vec<String> {
    T::augment_args(clap::Command::new("keys"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .filter(|id| id != "config")
        .collect()
}

/// The flags a command line gave: unset options and empty lists removed.
fn given(value: Value) -> Value {
    match value {
        Value::Dict(tag, dict) => Value::Dict(
            tag,
            dict.into_iter()
                .filter(|(_, v)| match v {
                    Value::Empty(..) => false,
                    Value::Array(_, items) => !items.is_empty(),
                    _ => true,
                })
                .map(|(k, v)| (k, given(v)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::Deserialize;

    use super::*;

    #[derive(clap::Parser, Serialize, Deserialize, Debug, Default)]
    #[serde(default, deny_unknown_fields)]
    struct Probe {
        #[arg(long)]
        #[serde(skip)]
        config: Option<PathBuf>,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        size: Option<usize>,
        #[arg(long, value_parser = humantime::parse_duration)]
        #[serde(with = "humantime_serde")]
        wait: Option<Duration>,
        #[arg(long)]
        #[serde(skip_serializing_if = "is_false")]
        loud: bool,
        #[arg(long)]
        peer: Vec<String>,
    }

    fn parse(args: &[&str]) -> Probe {
        clap::Parser::parse_from(std::iter::once("probe").chain(args.iter().copied()))
    }

    #[test]
    fn flags_win_over_env_over_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(
            &path,
            "name = \"file\"\nsize = 1\nwait = \"2m\"\nloud = true\npeer = [\"a\"]\n",
        )
        .unwrap();
        // A prefix no other test or process uses; the variables are only read here.
        std::env::set_var("PWCFGTEST_ONE_SIZE", "2");
        std::env::set_var("PWCFGTEST_ONE_WAIT", "1h 30m");
        std::env::set_var("PWCFGTEST_ONE_UNRELATED", "not a key, not read");
        let got: Probe =
            layered(&parse(&["--wait", "250ms"]), Some(&path), "PWCFGTEST_ONE_").unwrap();
        assert_eq!(got.name.as_deref(), Some("file"));
        assert_eq!(
            got.size,
            Some(2),
            "the environment's size loses to the file's"
        );
        assert_eq!(got.wait, Some(Duration::from_millis(250)));
        assert!(got.loud, "a switch left off hides the file's true");
        assert_eq!(
            got.peer,
            vec!["a".to_string()],
            "an empty list hides the file's"
        );
        let got: Probe = layered(&parse(&["--peer", "b"]), Some(&path), "PWCFGTEST_ONE_").unwrap();
        assert_eq!(got.wait, Some(Duration::from_secs(5400)));
        assert_eq!(got.peer, vec!["b".to_string()]);
        let got: Probe = layered(&parse(&[]), None, "PWCFGTEST_NONE_").unwrap();
        assert_eq!((got.name, got.size, got.wait), (None, None, None));
    }

    #[test]
    fn unknown_keys_bad_durations_and_missing_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(&path, "sise = 1\n").unwrap();
        let e = layered(&parse(&[]), Some(&path), "PWCFGTEST_TWO_").unwrap_err();
        assert!(e.to_string().contains("sise"), "{e}");
        std::fs::write(&path, "wait = \"soon\"\n").unwrap();
        let e = layered(&parse(&[]), Some(&path), "PWCFGTEST_TWO_").unwrap_err();
        assert!(e.to_string().contains("wait"), "{e}");
        std::fs::write(&path, "config = \"other.toml\"\n").unwrap();
        assert!(layered(&parse(&[]), Some(&path), "PWCFGTEST_TWO_").is_err());
        let e = layered(
            &parse(&[]),
            Some(&dir.path().join("gone.toml")),
            "PWCFGTEST_TWO_",
        )
        .unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }), "{e}");
    }
}
