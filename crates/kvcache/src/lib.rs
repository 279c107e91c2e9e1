//! (module map: filled in as files land)
