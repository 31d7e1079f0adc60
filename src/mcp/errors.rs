//! How results and errors reach the agent: a success carries
//! `structuredContent` and its text rendering; a domain error becomes a tool
//! result with `isError: true` and one line saying what to do. This is the
//! one place that mapping happens.

use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;

use crate::domain::PhoneError;

pub(super) fn success<T: Serialize>(value: &T, text: String) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(serde_json::to_value(value).expect("tool outputs serialize"));
    result
}

pub(super) fn tool_error(err: &PhoneError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(err.to_string())])
}
