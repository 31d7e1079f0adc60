//! phone: a global mailbox and address book for AI agents, served over MCP.

pub mod config;
pub mod domain;
pub mod http;
pub mod mcp;
pub mod metrics;
pub mod server;
pub mod startup;
pub mod store;
pub mod telemetry;

pub use config::Config;
pub use startup::Application;
