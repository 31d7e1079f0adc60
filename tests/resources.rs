//! The inbox as a resource (`phone://inbox`): read without consuming, and
//! a 2026-07-28 `subscriptions/listen` stream that gets
//! `notifications/resources/updated` when mail arrives through any replica.

mod common;

use std::time::Duration;

use common::*;
use rmcp::model::{
    ReadResourceRequestParams, ResourceContents, ServerNotification, SubscriptionFilter,
};
use serde_json::json;

/// The stream's next notification, if it is an inbox update within 10 s;
/// otherwise what came instead.
async fn next_update(s: &mut rmcp::service::Subscription) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(10), s.next()).await {
        Ok(Ok(Some(ServerNotification::ResourceUpdatedNotification(n))))
            if n.params.uri == "phone://inbox" =>
        {
            Ok(())
        }
        other => Err(format!("{other:?}")),
    }
}

fn inbox_filter() -> SubscriptionFilter {
    SubscriptionFilter::builder()
        .resource_subscriptions(["phone://inbox"])
        .build()
}

#[tokio::test]
async fn reading_the_inbox_resource_shows_unread_mail_and_marks_nothing() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "sends", "p").await;
    let bob = register(&c, "bob", "receives", "q").await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "subject": "hello", "body": "first"})),
    )
    .await;

    let as_bob = app.client_with(Some(&bob.token)).await;
    let listed = as_bob.list_all_resources().await.expect("resources/list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].uri, "phone://inbox");
    let read = as_bob
        .read_resource(ReadResourceRequestParams::new("phone://inbox"))
        .await
        .expect("resources/read");
    let text = match &read.contents[0] {
        ResourceContents::TextResourceContents { text, .. } => text.clone(),
        other => panic!("expected text, got {other:?}"),
    };
    assert!(
        text.contains("from alice") && text.contains("first"),
        "{text}"
    );
    assert_eq!(
        ok(&c, "phone_inbox", bob.with(json!({}))).await["messages"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "reading the resource consumed nothing"
    );

    let anonymous = app.client().await;
    let err = anonymous
        .read_resource(ReadResourceRequestParams::new("phone://inbox"))
        .await
        .expect_err("no token, no inbox");
    assert!(err.to_string().contains("authentication required"), "{err}");
    let err = as_bob
        .read_resource(ReadResourceRequestParams::new("phone://outbox"))
        .await
        .expect_err("unknown resource");
    assert!(err.to_string().contains("phone://inbox"), "{err}");
}

#[tokio::test]
async fn a_listener_is_told_when_mail_arrives_through_another_replica() {
    let database_url = fresh_database().await;
    let a = spawn_app_on(&database_url, &[]).await;
    let b = spawn_app_on(&database_url, &[]).await;
    let c = b.client().await;
    let alice = register(&c, "alice", "sends", "p").await;
    let bob = register(&c, "bob", "receives", "q").await;
    let carol = register(&c, "carol", "receives", "q").await;

    let listener = a.modern_client(Some(&bob.token)).await;
    let mut subscription = listener
        .listen(inbox_filter())
        .await
        .expect("subscriptions/listen");
    assert_eq!(
        subscription
            .acknowledged()
            .resource_subscriptions
            .as_deref(),
        Some(&["phone://inbox".to_owned()][..])
    );
    // The one update every stream gets once its watch is in place.
    let initial = next_update(&mut subscription).await;
    assert!(initial.is_ok(), "{initial:?}");
    // Mail for someone else says nothing to bob.
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "carol", "body": "not for bob"})),
    )
    .await;
    let quiet = tokio::time::timeout(Duration::from_millis(700), subscription.next()).await;
    assert!(
        quiet.is_err(),
        "no notification for another agent's mail: {quiet:?}"
    );

    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "wake"})),
    )
    .await;
    let note = next_update(&mut subscription).await;
    assert!(note.is_ok(), "an inbox update for bob's mail: {note:?}");
    // The notification carries nothing; the mail waits for bob's poll.
    let inbox = ok(&c, "phone_inbox", bob.with(json!({}))).await;
    assert_eq!(inbox["messages"][0]["body"], "wake");
    let _ = carol;

    // Again: one stream, many arrivals.
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "again"})),
    )
    .await;
    let again = next_update(&mut subscription).await;
    assert!(again.is_ok(), "{again:?}");
}

#[tokio::test]
async fn a_listen_without_a_valid_token_is_refused() {
    let app = spawn_app().await;
    let stranger = app.modern_client(None).await;
    let refused = stranger.listen(inbox_filter()).await;
    match refused {
        Err(e) => assert!(e.to_string().contains("authentication"), "{e}"),
        Ok(mut s) => {
            // The acknowledgment precedes the check; the stream then ends
            // with the error.
            let end = tokio::time::timeout(Duration::from_secs(5), s.next())
                .await
                .expect("the stream ends at once");
            let text = format!("{end:?}");
            assert!(text.contains("authentication"), "{text}");
        }
    }
}

#[tokio::test]
async fn a_listener_hears_of_mail_that_came_before_it_listened() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "sends", "p").await;
    let bob = register(&c, "bob", "receives", "q").await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "early"})),
    )
    .await;
    let listener = app.modern_client(Some(&bob.token)).await;
    let mut subscription = listener.listen(inbox_filter()).await.expect("listen");
    let first = next_update(&mut subscription).await;
    assert!(
        first.is_ok(),
        "one update once the watch is in place: {first:?}"
    );
}

#[tokio::test]
async fn a_rotated_token_stops_hearing_and_streams_per_agent_are_capped() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "sends", "p").await;
    let bob = register(&c, "bob", "receives", "q").await;
    let listener = app.modern_client(Some(&bob.token)).await;
    let mut streams = Vec::new();
    for _ in 0..phone::mcp::resources::LISTENS_PER_AGENT {
        let mut s = listener.listen(inbox_filter()).await.expect("listen");
        // The update every stream gets once its watch is in place.
        let _ = tokio::time::timeout(Duration::from_secs(10), s.next()).await;
        streams.push(s);
    }
    let over = listener.listen(inbox_filter()).await;
    let text = match over {
        Err(e) => e.to_string(),
        Ok(mut s) => format!(
            "{:?}",
            tokio::time::timeout(Duration::from_secs(5), s.next()).await
        ),
    };
    assert!(
        text.contains("streams open"),
        "a fifth stream is refused: {text}"
    );

    ok(&c, "phone_rotate_token", bob.with(json!({}))).await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "secret"})),
    )
    .await;
    let after = tokio::time::timeout(Duration::from_secs(10), streams[0].next()).await;
    let text = format!("{after:?}");
    assert!(
        !text.contains("ResourceUpdated"),
        "the old token hears nothing after rotation: {text}"
    );
}

#[tokio::test]
async fn the_handshake_versions_are_not_offered_resources_subscribe() {
    let app = spawn_app().await;
    let legacy = app.client().await;
    let info = legacy.peer_info().expect("initialize result");
    let resources = info.capabilities.resources.as_ref().expect("resources");
    assert_ne!(resources.subscribe, Some(true), "{resources:?}");
}
