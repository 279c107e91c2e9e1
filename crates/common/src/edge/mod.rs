//! The HTTP edge shared by every listener that faces clients (the router's API, the auditor's
//! UI, every `/metrics` listener): what idle or hostile peers cannot hold (I14).
//!
//! - `limits.rs`: `EdgeLimits`, the deadlines and caps
//! - `table.rs`: the open connections, their phase (fresh, busy, idle) and which to close
//! - `serve.rs`: `serve_edge`, the accept loop, the reaper, and the `Connection` request
//!   extension through which a handler marks its connection authenticated
//! - `body.rs`: the request body's deadline and the response body's in-flight mark
//!
//! A request head must arrive within `header_timeout` of its first byte and the first request
//! within `first_request_timeout` of accept (HTTP/1 and HTTP/2); a kept-alive connection is
//! closed after `idle_timeout` without a request, and HTTP/2 peers that stop answering pings
//! are dropped. Unauthenticated connections count against their source address, authenticated
//! ones against their principal; when a cap is reached the oldest idle connection in the way is
//! closed for the new one, which is refused only when everything in the way is busy.

mod body;
mod limits;
mod serve;
mod table;

pub use limits::EdgeLimits;
pub use serve::{serve_edge, Connection, EdgeCounters};
pub use table::{CloseReason, Phase, Refusal};
