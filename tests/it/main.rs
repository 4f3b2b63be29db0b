//! The integration suite: one test binary (to save link time) that drives a real server over a
//! real loopback connection. `harness` starts servers and hands out clients; each other module
//! covers one area. Run with `cargo nextest run --test it` (or `scripts/test` for everything).

mod harness;

mod auth;
mod crash;
mod faults;
mod health;
mod hostile;
mod interactions;
mod interop;
mod log;
mod operations;
mod queue;
mod reflection;
mod resume;
mod scale;
mod services;
mod sessions;
mod support;
mod tls;
mod transcript;
mod translator;
mod turn_ended;
