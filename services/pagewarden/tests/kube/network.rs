//! The links the NetworkPolicies allow, as `(from, to, port)`: `from` is a component, `*` for
//! any source, or `ns:NAME` for the pods of namespace NAME.

use std::collections::BTreeSet;

use serde_yaml::Value;

use super::{kind, labels, name, COMPONENT};

/// The component a NetworkPolicy's `podSelector` (or a peer's) picks by its
/// `app.kubernetes.io/component` label; `None` for any other selector (`{}` is every pod).
fn component(selector: &Value) -> Option<String> {
    labels(&selector["matchLabels"]).get(COMPONENT).cloned()
}

/// The `(from, to, port)` links the NetworkPolicies allow, and whether ingress is denied by
/// default; problems with policies the checks cannot read.
pub fn allowed_links(
    docs: &[(String, Value)],
    p: &mut Vec<String>,
) -> (BTreeSet<(String, String, u16)>, bool) {
    let mut links = BTreeSet::new();
    let mut default_deny = false;
    for (_, np) in docs.iter().filter(|(_, d)| kind(d) == "NetworkPolicy") {
        let spec = &np["spec"];
        let ingress = spec["ingress"].as_sequence().cloned().unwrap_or_default();
        let Some(target) = component(&spec["podSelector"]) else {
            // `policyTypes` left out means Ingress.
            let types = spec["policyTypes"].as_sequence();
            let ingress_type =
                types.is_none_or(|t| t.iter().any(|x| x.as_str() == Some("Ingress")));
            default_deny |= ingress.is_empty() && ingress_type;
            if !ingress.is_empty() {
                p.push(format!(
                    "NetworkPolicy {} opens ingress to every pod",
                    name(np)
                ));
            }
            continue;
        };
        for rule in &ingress {
            let from: Vec<String> = match rule["from"].as_sequence() {
                None => vec!["*".into()],
                Some(peers) => peers
                    .iter()
                    .map(|peer| {
                        let ns = labels(&peer["namespaceSelector"]["matchLabels"]);
                        match (
                            component(&peer["podSelector"]),
                            ns.get("kubernetes.io/metadata.name"),
                        ) {
                            (Some(c), None) => c,
                            (None, Some(n)) => format!("ns:{n}"),
                            _ => format!("<a peer this test cannot read: {peer:?}>"),
                        }
                    })
                    .collect(),
            };
            let ports: Vec<u16> = rule["ports"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(|x| x["port"].as_u64()?.try_into().ok())
                .collect();
            if ports.is_empty() {
                p.push(format!("NetworkPolicy {} opens every port", name(np)));
            }
            for f in &from {
                for port in &ports {
                    links.insert((f.clone(), target.clone(), *port));
                }
            }
        }
    }
    (links, default_deny)
}
