//! phone: a global mailbox and address book for AI agents, served over MCP.
//!
//! Layers, each importing only those below it:
//!
//! ```text
//! cli       the command line: parses it, serves, or runs a client command
//! channel   `phone channel`: a Claude Code channel (stdio MCP server) fed by
//!           a watch on the agent's inbox on a server
//! hook      Claude Code hooks (`phone hook …`): an MCP client of a server
//! remote    the client side: server and token (env, plugin options,
//!           profile), MCP calls over HTTP
//! admin     the operator's commands (`phone admin …`), against the database
//! startup   composition root: Config -> each layer's settings -> serve
//! config    the environment, parsed into each layer's settings
//! http      router, layers, /health, the accept loop
//! console   the web console's pages (/console), sessions, forms
//! mcp       tool definitions, argument parsing, wire types, rendering, errors
//! webhooks  the delivery worker: claims due deliveries, POSTs them signed
//! domain    the rules, in plain types (no SQL, no wire format)
//! store     pool, migrations, every SQL statement, group commit, LISTEN
//! telemetry logs, traces, metrics (plain values in)
//! ```

pub mod admin;
pub mod channel;
pub mod cli;
pub mod config;
pub mod console;
pub mod domain;
pub mod hook;
pub mod http;
pub mod mcp;
pub mod remote;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod webhooks;

pub use config::Config;
pub use startup::Application;
