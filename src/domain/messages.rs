//! The mailbox: sending, replying, polling (read or lease), acknowledging,
//! receipts and threads.

use std::time::Duration;

use base64::Engine as _;

use super::types::{InvalidInput, MessageId, Receipt};
use super::{Call, Caller, Credentials, Phone, PhoneError};
use crate::store::{
    self, QueuedPoll,
    messages::{AckOutcome, Look},
};

pub use super::send::{Recipients, SendRequest, Sent};

pub use crate::store::rows::{Delivery, Message, Sent as OutboxEntry};

pub const INBOX_LIMIT_MAX: u32 = 100;
/// `unread_remaining` counts at most this many, so a poll never scans a backlog.
pub const UNREAD_COUNT_CAP: i64 = 100;
/// A read or lease poll stops adding messages once those it holds reach
/// this many bytes of text (body and subject): always one, then each
/// while those before it hold less. A hundred messages of 64 KiB would
/// be 6.4 MB of text a model cannot read whole (Claude Code keeps a
/// tool answer over 50,000 characters in a file, with a 2 kB preview,
/// and the answer carries its text twice: content and structured)
/// although they were marked read; the rest wait for the next poll.
pub const ANSWER_BYTES_MAX: i64 = 32 * 1024;
/// The longest wait a server allows (`PHONE_MAX_WAIT_SECS` may lower it).
pub const WAIT_SECONDS_MAX: u32 = 25;
pub const LEASE_SECONDS_DEFAULT: u32 = 300;
pub const LEASE_SECONDS_MAX: u32 = 3600;
/// How often a message is leased out before it dies, by default.
pub const MAX_DELIVERIES_DEFAULT: u32 = 10;
pub const MAX_DELIVERIES_MAX: u32 = 1000;
pub const ACK_IDS_MAX: usize = 100;
pub const LIST_LIMIT_MAX: u32 = 100;
/// `PHONE_STALE_AFTER_DAYS` unless set.
pub const STALE_AFTER_DAYS_DEFAULT: u32 = 90;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxMode {
    /// Marks what it returns as read, in the poll's transaction.
    Read,
    /// Hands out messages for `seconds`; they come back unless acknowledged,
    /// at most `max_deliveries` times in all.
    Lease { seconds: u32, max_deliveries: u32 },
    /// Shows the next unread messages without changing anything.
    Peek,
    /// The most recent messages, read or not, newest first, older than
    /// `before` (a message id, from a cursor) when given; changes nothing.
    History { before: Option<i64> },
}

/// phone_inbox's arguments as given (types checked, values not yet).
#[derive(Debug, Clone, Copy, Default)]
pub struct InboxArgs<'a> {
    pub limit: Option<u32>,
    pub peek: bool,
    pub include_read: bool,
    pub mode: Option<&'a str>,
    pub lease_seconds: Option<u32>,
    pub max_deliveries: Option<u32>,
    pub wait_seconds: Option<u32>,
    /// With include_read: `next_cursor` of the page before.
    pub cursor: Option<&'a str>,
}

/// This server's settings for mail.
#[derive(Debug, Clone, Copy)]
pub struct MailRules {
    /// The longest a phone_inbox call may wait for mail (seconds).
    pub max_wait_secs: u32,
    /// How often a message is leased out, at most, before it dies (unless
    /// a poll asks for another number).
    pub max_deliveries: u32,
    /// Webhooks may point at private addresses and use http (local stacks,
    /// tests).
    pub webhooks_allow_private: bool,
    /// Agents unseen for this many days are stale: out of search results
    /// (found by exact name only) until seen again. 0: never.
    pub stale_after_days: u32,
}

impl Default for MailRules {
    fn default() -> Self {
        Self {
            max_wait_secs: WAIT_SECONDS_MAX,
            max_deliveries: MAX_DELIVERIES_DEFAULT,
            webhooks_allow_private: false,
            stale_after_days: STALE_AFTER_DAYS_DEFAULT,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct InboxRequest {
    pub limit: u32,
    pub mode: InboxMode,
    pub wait: Duration,
}

impl InboxRequest {
    pub fn parse(raw: InboxArgs<'_>, rules: &MailRules) -> Result<Self, InvalidInput> {
        let InboxArgs {
            limit,
            peek,
            include_read,
            mode,
            lease_seconds,
            max_deliveries,
            wait_seconds,
            cursor,
        } = raw;
        let max_wait = rules.max_wait_secs;
        let limit = limit.unwrap_or(10);
        if !(1..=INBOX_LIMIT_MAX).contains(&limit) {
            return Err(InvalidInput::new(
                "limit",
                format!("must be between 1 and {INBOX_LIMIT_MAX}; got {limit}"),
            ));
        }
        let lease = match mode.map(str::trim) {
            None | Some("") | Some("read") => false,
            Some("lease") => true,
            Some(other) => {
                return Err(InvalidInput::new(
                    "mode",
                    format!("must be \"read\" or \"lease\"; got {other:?}"),
                ));
            }
        };
        for (given, field) in [
            (lease_seconds.is_some(), "lease_seconds"),
            (max_deliveries.is_some(), "max_deliveries"),
        ] {
            if given && !lease {
                return Err(InvalidInput::new(field, "only applies with mode \"lease\""));
            }
        }
        let mode = match (lease, peek, include_read) {
            (true, false, false) => InboxMode::Lease {
                seconds: lease_seconds.unwrap_or(LEASE_SECONDS_DEFAULT),
                max_deliveries: max_deliveries.unwrap_or(rules.max_deliveries),
            },
            (true, _, _) => {
                return Err(InvalidInput::new(
                    "mode",
                    "\"lease\" cannot be combined with peek or include_read",
                ));
            }
            (false, _, true) => InboxMode::History {
                before: cursor.map(decode_history_cursor).transpose()?,
            },
            (false, true, false) => InboxMode::Peek,
            (false, false, false) => InboxMode::Read,
        };
        if cursor.is_some() && !matches!(mode, InboxMode::History { .. }) {
            return Err(InvalidInput::new(
                "cursor",
                "pages include_read or a search: pass it with include_read=true, or with the same query",
            ));
        }
        let wait = wait_seconds.unwrap_or(0);
        if wait > max_wait {
            return Err(InvalidInput::new(
                "wait_seconds",
                format!("must be from 0 to {max_wait}; got {wait}"),
            ));
        }
        if wait > 0 && matches!(mode, InboxMode::History { .. }) {
            return Err(InvalidInput::new(
                "wait_seconds",
                "cannot be combined with include_read",
            ));
        }
        Ok(Self {
            limit,
            mode,
            wait: Duration::from_secs(wait.into()),
        })
    }
}

#[derive(Debug, Clone)]
pub struct Inbox {
    /// In lease mode each carries its `leased_until`; otherwise none does.
    pub messages: Vec<Message>,
    /// Unread messages still waiting after this call; 100 means "100 or more".
    pub unread_remaining: i64,
    /// What the poll acknowledged first (phone_inbox's `ack`), if asked.
    pub acked: Option<Acked>,
    /// The poll stopped at its byte budget ([`ANSWER_BYTES_MAX`]) while
    /// more mail waits.
    pub full: bool,
    /// include_read: the next (older) page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Acked {
    /// Ids now acknowledged (including ones acknowledged before).
    pub acknowledged: Vec<MessageId>,
    /// Ids that are not messages addressed to you.
    pub not_found: Vec<MessageId>,
    /// Receipts of deliveries that are over (the message went to another
    /// worker since), with the delivery the message is on now.
    pub stale: Vec<(AckRef, i32)>,
    /// Not acknowledged, for now (phone_inbox's `ack` only): their rows
    /// were busy and the acknowledgement on its own failed; to be repeated,
    /// as given: a receipt stays a receipt (its message's plain id would
    /// acknowledge whatever delivery is current, another worker's).
    pub pending: Vec<AckRef>,
}

impl Acked {
    /// A message is acknowledged (or not found) once, whatever forms name
    /// it: its receipt and its plain id in one list were "2 acknowledged".
    fn add(&mut self, r: &AckRef, outcome: AckOutcome) {
        let once = |ids: &mut Vec<MessageId>, id: MessageId| {
            if !ids.contains(&id) {
                ids.push(id);
            }
        };
        match outcome {
            AckOutcome::Acknowledged => once(&mut self.acknowledged, r.message()),
            AckOutcome::NotFound => once(&mut self.not_found, r.message()),
            AckOutcome::Stale { current } => self.stale.push((r.clone(), current)),
        }
    }

    fn merge(&mut self, other: Acked) {
        for id in other.acknowledged {
            self.add(&AckRef::Id(id), AckOutcome::Acknowledged);
        }
        for id in other.not_found {
            self.add(&AckRef::Id(id), AckOutcome::NotFound);
        }
        self.stale.extend(other.stale);
    }
}

#[derive(Debug, Clone)]
pub struct Outbox {
    pub messages: Vec<OutboxEntry>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Thread {
    pub thread_id: MessageId,
    /// Oldest first.
    pub messages: Vec<Message>,
    pub next_cursor: Option<String>,
}

impl Thread {
    /// Cuts the page to what a model's answer has room for
    /// ([`fit_answer`]); the cursor then continues after its last message.
    /// Whether it was cut. (The console shows whole pages.)
    pub fn fit_answer(&mut self) -> bool {
        fit_page(
            &mut self.messages,
            &mut self.next_cursor,
            Message::text_bytes,
            |m| m.id,
        )
    }
}

impl Outbox {
    /// As [`Thread::fit_answer`]: its text shows no bodies, its result does.
    pub fn fit_answer(&mut self) -> bool {
        fit_page(
            &mut self.messages,
            &mut self.next_cursor,
            OutboxEntry::text_bytes,
            |m| m.id,
        )
    }
}

/// [`fit_answer`] for a page with a keyset cursor: when cut, the cursor
/// continues after the last message kept.
fn fit_page<T>(
    messages: &mut Vec<T>,
    next_cursor: &mut Option<String>,
    text_bytes: impl Fn(&T) -> i64,
    id: impl Fn(&T) -> i64,
) -> bool {
    let cut = fit_answer(messages, text_bytes);
    if cut {
        *next_cursor = messages.last().map(|m| encode_cursor(id(m)));
    }
    cut
}

/// A keyset cursor over message ids, opaque to the agent.
fn encode_cursor(id: i64) -> String {
    encode_tagged("m", id)
}

/// include_read's cursor: tagged apart, so that another tool's (which
/// pages in its own direction) is refused rather than taken for it.
fn encode_history_cursor(id: i64) -> String {
    encode_tagged("h", id)
}

fn encode_tagged(tag: &str, id: i64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{tag}:{id}"))
}

pub fn decode_cursor(raw: &str) -> Result<i64, InvalidInput> {
    decode_tagged(raw, "m").ok_or_else(|| {
        InvalidInput::new(
            "cursor",
            "is not a cursor of this tool; pass its own next_cursor back unchanged",
        )
    })
}

fn decode_history_cursor(raw: &str) -> Result<i64, InvalidInput> {
    decode_tagged(raw, "h").ok_or_else(|| {
        InvalidInput::new(
            "cursor",
            "is not a cursor of include_read; pass its next_cursor back unchanged, with include_read=true",
        )
    })
}

fn decode_tagged(raw: &str, tag: &str) -> Option<i64> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(raw.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| {
            s.strip_prefix(tag)
                .and_then(|s| s.strip_prefix(':'))
                .and_then(|n| n.parse::<i64>().ok())
        })
        .filter(|n| *n >= 0)
}

/// Keeps the first `limit` of `rows` (fetched one more than asked); the
/// cursor continues after the last one kept, when more exist.
fn page<T>(mut rows: Vec<T>, limit: u32, id: impl Fn(&T) -> i64) -> (Vec<T>, Option<String>) {
    let limit = limit as usize;
    if rows.len() > limit {
        rows.truncate(limit);
        let cursor = rows.last().map(|r| encode_cursor(id(r)));
        (rows, cursor)
    } else {
        (rows, None)
    }
}

/// Keeps the messages an answer has room for, as a poll takes them: the
/// first always, then each while those before it hold less than
/// [`ANSWER_BYTES_MAX`] of text. Whether any was left out. For answers
/// that take nothing and page on with a cursor (include_read, a thread, a
/// search, the outbox): a thread of a hundred long messages was 6.4 MB of text, twice
/// over, that no model reads.
pub(crate) fn fit_answer<T>(messages: &mut Vec<T>, text_bytes: impl Fn(&T) -> i64) -> bool {
    let mut before = 0;
    let room = messages
        .iter()
        .take_while(|m| {
            let fits = before < ANSWER_BYTES_MAX;
            before += text_bytes(m);
            fits
        })
        .count();
    let cut = room < messages.len();
    messages.truncate(room);
    cut
}

/// A peek keeps every message it found, so that the hooks and channels
/// that wake idle agents see what is new among them, but shows bodies only
/// while those before hold less than [`ANSWER_BYTES_MAX`] (the first
/// always): past that, a message keeps its sender, subject and size. One
/// stranger's 70 bodies of 64 KiB of quotes made a peek of 100 over 18 MB
/// of JSON, past what the hooks' client reads, and no wake-up told its
/// agent of anyone's mail.
fn omit_bodies_past_budget(messages: &mut [Message]) {
    let mut before = 0;
    for m in messages {
        let bytes = m.text_bytes();
        if before >= ANSWER_BYTES_MAX {
            m.body_omitted = Some(m.body.len() as i64);
            m.body = String::new();
        }
        before += bytes;
    }
}

/// Without notifications (listener reconnecting), waiters re-check this often.
const FALLBACK_RECHECK: Duration = Duration::from_secs(2);
/// An inbox watch renews its waiter row this often.
const WATCH_RENEW: Duration = Duration::from_secs(30);

impl Phone {
    /// Polls once; with `wait`, and nothing to return, waits for mail to
    /// arrive (a notification from any replica) or for the time to run out,
    /// which is never later than the request's deadline. Mail a poll took
    /// for a caller that has gone meanwhile goes back to unread.
    pub async fn inbox(
        &self,
        creds: &Credentials,
        req: InboxRequest,
        call: &Call,
    ) -> Result<Inbox, PhoneError> {
        self.inbox_acking(creds, req, &[], call).await
    }

    /// phone_inbox with `ack` (lease mode): the first poll acknowledges
    /// `acks` in its own statement, the batch's, then takes new mail: one
    /// call and no statement of its own per round, where a worker made a
    /// poll and a phone_ack. A poll that fails leaves its acknowledgements
    /// undone or done, and a retry of the whole call does them again
    /// harmlessly. Stale receipts are reported beside the new mail rather
    /// than refusing it: the caller should not act on those messages
    /// again, and needs the poll all the same.
    pub async fn inbox_acking(
        &self,
        creds: &Credentials,
        req: InboxRequest,
        acks: &[AckRef],
        call: &Call,
    ) -> Result<Inbox, PhoneError> {
        // The wait counts from the call's arrival, not from its first look.
        let mut deadline = tokio::time::Instant::now() + req.wait;
        if let Some(request_deadline) = call.deadline {
            deadline = deadline.min(request_deadline);
        }
        let (me_id, mut first) = match self.poll(creds, req, acks, call).await? {
            Some(polled) => polled,
            None => return Err(self.authentication_error(creds).await),
        };
        if req.wait.is_zero()
            || !first.messages.is_empty()
            || deadline <= tokio::time::Instant::now()
        {
            return Ok(first);
        }
        let acked = first.acked.take();
        let outcome = self.wait_for_mail(creds, req, call, me_id, deadline).await;
        outcome.map(|inbox| Inbox { acked, ..inbox })
    }

    /// The rest of a long poll whose first look found nothing.
    async fn wait_for_mail(
        &self,
        creds: &Credentials,
        req: InboxRequest,
        call: &Call,
        me_id: i64,
        deadline: tokio::time::Instant,
    ) -> Result<Inbox, PhoneError> {
        let wakeup = self.store.wakeup().clone();
        let mut subscription = wakeup.subscribe(me_id);
        let mut registered = wakeup.connections();
        let mut waiter_id = self.add_waiter(me_id, req.wait).await?;
        let outcome = async {
            loop {
                // The listener connected again, perhaps to a new primary
                // after a failover, where the (unlogged) row is not: without
                // it senders there would not wake this poll until its end.
                if wakeup.connections() != registered {
                    registered = wakeup.connections();
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let old =
                        std::mem::replace(&mut waiter_id, self.add_waiter(me_id, left).await?);
                    let phone = self.clone();
                    tokio::spawn(async move { phone.remove_waiter(old).await });
                }
                // A caller that left with input unread on its connection is
                // not seen by its request's cancellation: asked before each
                // look, it takes nothing (its mail would only go back).
                if call.caller_left() {
                    return Err(PhoneError::CallerGone);
                }
                // The first round covers mail that arrived before the waiter
                // row was visible to senders.
                let latest = match self.poll(creds, req, &[], call).await? {
                    Some((_, polled)) => polled,
                    // Revoked while waiting.
                    None => return Err(self.authentication_error(creds).await),
                };
                if !latest.messages.is_empty() {
                    return Ok(latest);
                }
                let recheck = if self.store.wakeup().is_listening() {
                    req.wait
                } else {
                    FALLBACK_RECHECK
                };
                tokio::select! {
                    changed = subscription.changes.changed() => {
                        if changed.is_err() { return Ok(latest); }
                    }
                    _ = tokio::time::sleep(recheck) => {}
                    // One last look: a wake-up can be lost (a replica's
                    // listener reconnecting, a failed NOTIFY), mail cannot.
                    _ = tokio::time::sleep_until(deadline) => {
                        return match self.poll(creds, req, &[], call).await? {
                            Some((_, last)) => Ok(last),
                            None => Err(self.authentication_error(creds).await),
                        };
                    }
                    _ = call.gone.cancelled() => return Err(PhoneError::CallerGone),
                    _ = self.shutdown.cancelled() => return Ok(latest),
                }
            }
        }
        .await;
        // Off the response's path: a stale row costs at most a spare NOTIFY.
        let phone = self.clone();
        tokio::spawn(async move { phone.remove_waiter(waiter_id).await });
        outcome
    }

    /// Calls `updated` once the watch is in place (covering mail that came
    /// before it was), then whenever mail arrives for the agent of `creds`
    /// (a wake-up from any replica; a burst coalesces into one call), until
    /// `stop`, the server's shutdown, `until`, or `updated` answers false
    /// (its listener left). The token is checked again before every call and
    /// at every renewal: a rotated or revoked token stops hearing at once.
    /// A hint only: the mail itself waits in the inbox whatever happens here.
    pub async fn watch_inbox<F, Fut>(
        &self,
        creds: &Credentials,
        stop: &tokio_util::sync::CancellationToken,
        until: tokio::time::Instant,
        mut updated: F,
    ) -> Result<(), PhoneError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let me = self.authenticate(creds).await?;
        let wakeup = self.store.wakeup().clone();
        let mut subscription = wakeup.subscribe(me.id);
        let mut first = true;
        loop {
            // Senders notify only agents with a live waiter row: renew it
            // before it expires, and at once when the listener connected
            // again (perhaps to a new primary, which lacks the unlogged row).
            let registered = wakeup.connections();
            let waiter_id = self.add_waiter(me.id, WATCH_RENEW).await?;
            let renew_at = (tokio::time::Instant::now() + WATCH_RENEW).min(until);
            // A send may have come between the acknowledgment and the row.
            let mut pending = std::mem::take(&mut first);
            let outcome: Result<bool, PhoneError> = loop {
                if pending {
                    pending = false;
                    if let Err(e) = self.authenticate(creds).await {
                        break Err(e);
                    }
                    // A listener that stops reading must not hold the watch
                    // past its end or the server's shutdown.
                    tokio::select! {
                        heard = updated() => if !heard { break Ok(false) },
                        _ = tokio::time::sleep_until(until) => break Ok(false),
                        _ = stop.cancelled() => break Ok(false),
                        _ = self.shutdown.cancelled() => break Ok(false),
                    }
                }
                tokio::select! {
                    changed = subscription.changes.changed() => {
                        if changed.is_err() { break Ok(false); }
                        if wakeup.connections() != registered {
                            // Told once the new row is in place.
                            first = true;
                            break Ok(true);
                        }
                        pending = true;
                    }
                    _ = tokio::time::sleep_until(renew_at) => break Ok(renew_at < until),
                    _ = stop.cancelled() => break Ok(false),
                    _ = self.shutdown.cancelled() => break Ok(false),
                }
            };
            let phone = self.clone();
            tokio::spawn(async move { phone.remove_waiter(waiter_id).await });
            if !outcome? {
                return Ok(());
            }
            self.authenticate(creds).await?;
        }
    }

    async fn add_waiter(&self, me_id: i64, wait: Duration) -> Result<i64, PhoneError> {
        let db = self.store.db().await?;
        // Slack beyond the wait itself covers clock skew and slow statements.
        let ttl = wait.as_secs_f64() + 5.0;
        Ok(store::messages::add_waiter(&db, me_id, ttl).await?)
    }

    async fn remove_waiter(&self, id: i64) {
        let outcome = async {
            let db = self.store.db().await?;
            store::messages::remove_waiter(&db, id).await
        }
        .await;
        if let Err(e) = outcome {
            // The row expires by itself; a stale row only costs a spare NOTIFY.
            tracing::debug!(error = %e, "could not remove waiter row");
        }
    }

    /// One poll in one statement (one round trip), the caller verified
    /// inside it. `None` when the credentials were not accepted; otherwise
    /// the caller's id and what the poll returned. What a read or a lease
    /// took for a caller that has gone by the time it returns goes back.
    async fn poll(
        &self,
        creds: &Credentials,
        req: InboxRequest,
        acks: &[AckRef],
        call: &Call,
    ) -> Result<Option<(i64, Inbox)>, PhoneError> {
        let mut polled = self
            .poll_once(creds, req, acks, call)
            .await
            .map_err(|e| taken_hint(e, req))?;
        let outcomes = std::mem::take(&mut polled.acks);
        let takes = matches!(req.mode, InboxMode::Read | InboxMode::Lease { .. });
        if takes {
            self.name_the_other_recipients(&mut polled.messages).await;
        }
        if takes && !polled.messages.is_empty() {
            if call.gone.is_cancelled() {
                self.store.give_back(polled);
                return Err(PhoneError::CallerGone);
            }
            if let Some(handover) = &call.handover {
                handover.hold(&self.store, polled.clone());
            }
        }
        let Some((me_id, mut inbox)) = inbox(polled, req.mode) else {
            return Ok(None);
        };
        if !acks.is_empty() {
            inbox.acked = Some(self.settle_acks(creds, acks, outcomes).await?);
        }
        Ok(Some((me_id, inbox)))
    }

    /// The acknowledgements a poll's statement carried: what it decided,
    /// and the ones it left undecided (their rows were locked by another
    /// transaction) acknowledged alone, as phone_ack would.
    async fn settle_acks(
        &self,
        creds: &Credentials,
        refs: &[AckRef],
        outcomes: Vec<Option<AckOutcome>>,
    ) -> Result<Acked, PhoneError> {
        let mut acked = Acked {
            acknowledged: Vec::new(),
            not_found: Vec::new(),
            stale: Vec::new(),
            pending: Vec::new(),
        };
        let mut undecided = Vec::new();
        for (n, r) in refs.iter().enumerate() {
            match outcomes.get(n).copied().flatten() {
                Some(outcome) => acked.add(r, outcome),
                None => undecided.push(r.clone()),
            }
        }
        if !undecided.is_empty() {
            // The poll committed and its mail is the caller's now: a failure
            // here must not hide it. What could not be done is said, to be
            // passed again (acknowledging twice is harmless).
            match self.acknowledge(creds, &undecided).await {
                Ok(rest) => acked.merge(rest),
                Err(e) => {
                    tracing::warn!(error = %e, acks = undecided.len(), "acknowledgements left for the caller to repeat");
                    acked.pending = undecided;
                }
            }
        }
        Ok(acked)
    }

    /// Who else a group send went to, for the copies a read or lease poll
    /// took (the batch statement leaves it out). Best effort: the mail is
    /// taken already, and an answer without the list loses nothing.
    async fn name_the_other_recipients(&self, messages: &mut [Message]) {
        if messages.iter().all(|m| m.group_id.is_none()) {
            return;
        }
        // Bounded: the mail is taken, and a busy pool must not hold its
        // answer (and the caller) for the pool's whole wait.
        let filled = tokio::time::timeout(std::time::Duration::from_millis(250), async {
            let db = self.store.db().await?;
            store::messages::fill_also_to(&db, messages).await
        })
        .await;
        match filled {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::telemetry::error_chain(&e), "group recipients not named");
            }
            Err(_) => tracing::warn!("group recipients not named: no connection within 250 ms"),
        }
    }

    async fn poll_once(
        &self,
        creds: &Credentials,
        req: InboxRequest,
        acks: &[AckRef],
        call: &Call,
    ) -> Result<store::Polled, PhoneError> {
        let limit = i64::from(req.limit);
        let lease = match req.mode {
            InboxMode::Lease {
                seconds,
                max_deliveries,
            } => Some(store::Lease {
                seconds,
                max_deliveries,
            }),
            InboxMode::Read => None,
            InboxMode::Peek | InboxMode::History { .. } => {
                return self.look(creds, req, call, limit).await;
            }
        };
        // The hot path: together with the other calls in flight, also the
        // other polls of the same inbox.
        let poll = QueuedPoll {
            token: creds.token.0,
            claimed: creds.claimed_name().map(str::to_owned),
            limit,
            lease,
            acks: acks.iter().map(|r| (r.message().0, r.delivery())).collect(),
        };
        Ok(self.store.poll(poll, call.gone.clone()).await?)
    }

    /// A poll that takes nothing (peek, history): on its own connection.
    async fn look(
        &self,
        creds: &Credentials,
        req: InboxRequest,
        call: &Call,
        limit: i64,
    ) -> Result<store::Polled, PhoneError> {
        // A page of the history is cut to what an answer has room for, and
        // goes on with a cursor (one more row tells whether more exist). A
        // peek keeps every message: the hooks and channels that wake idle
        // agents look among its 100 for what is new, and a page cut by the
        // bodies of the oldest would hide it from them. Past the budget it
        // shows their sizes instead of their bodies.
        let (look, fetch) = match req.mode {
            InboxMode::History { before } => (Look::History { before }, limit + 1),
            _ => (Look::Peek, limit),
        };
        if call.gone.is_cancelled() {
            return Err(PhoneError::CallerGone);
        }
        let db = self.store.db().await?;
        let mut looked = store::messages::look(
            &db,
            look,
            creds.token.as_bytes(),
            creds.claimed_name(),
            fetch,
            UNREAD_COUNT_CAP,
        )
        .await?;
        match look {
            Look::History { .. } => {
                let more = looked.messages.len() as i64 > limit;
                looked.messages.truncate(limit as usize);
                looked.full = fit_answer(&mut looked.messages, Message::text_bytes);
                looked.more = more || looked.full;
            }
            Look::Peek => omit_bodies_past_budget(&mut looked.messages),
        }
        Ok(looked)
    }

    /// Acknowledges leased (or any received) messages: they will not come
    /// back. A receipt acknowledges only the delivery it came with: when the
    /// message was handed to another worker since, it is refused (and the
    /// others are acknowledged all the same).
    pub async fn ack(&self, creds: &Credentials, refs: &[AckRef]) -> Result<Acked, PhoneError> {
        let acked = self.acknowledge(creds, refs).await?;
        if acked.stale.is_empty() {
            Ok(acked)
        } else {
            Err(PhoneError::StaleReceipts {
                acknowledged: acked.acknowledged,
                stale: acked.stale,
            })
        }
    }

    /// Each reference's fate. The caller is verified inside the statement,
    /// as for sends and polls.
    async fn acknowledge(&self, creds: &Credentials, refs: &[AckRef]) -> Result<Acked, PhoneError> {
        // No row back means "not accepted" only for a request of some ids.
        debug_assert!(!refs.is_empty(), "an acknowledgement of nothing");
        let wanted: Vec<(i64, Option<i32>)> =
            refs.iter().map(|r| (r.message().0, r.delivery())).collect();
        let db = self.store.db().await?;
        let outcomes =
            store::messages::ack(&db, creds.token.as_bytes(), creds.claimed_name(), &wanted)
                .await?;
        drop(db);
        let Some(outcomes) = outcomes else {
            return Err(self.authentication_error(creds).await);
        };
        let mut acked = Acked {
            acknowledged: Vec::new(),
            not_found: Vec::new(),
            stale: Vec::new(),
            pending: Vec::new(),
        };
        for (r, outcome) in refs.iter().zip(outcomes) {
            acked.add(r, outcome);
        }
        Ok(acked)
    }

    /// What the caller sent, newest first, with each message's state.
    pub async fn outbox(
        &self,
        me: &Caller,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Outbox, PhoneError> {
        let db = self.store.db().await?;
        let rows = store::messages::outbox(&db, me.id, before, i64::from(limit) + 1).await?;
        let (messages, next_cursor) = page(rows, limit, |m| m.id);
        Ok(Outbox {
            messages,
            next_cursor,
        })
    }

    /// The conversation a message belongs to, oldest first, for its
    /// participants only.
    pub async fn thread(
        &self,
        me: &Caller,
        message_id: MessageId,
        limit: u32,
        after: Option<i64>,
    ) -> Result<Thread, PhoneError> {
        let db = self.store.db().await?;
        let thread_id = store::messages::thread_of(&db, message_id.0, me.id)
            .await?
            .ok_or(PhoneError::UnknownMessage(message_id))?;
        let rows =
            store::messages::thread(&db, thread_id, me.id, after, i64::from(limit) + 1).await?;
        let (mut messages, next_cursor) = page(rows, limit, |m| m.id);
        for m in &mut messages {
            m.leased_until = None;
        }
        Ok(Thread {
            thread_id: MessageId(thread_id),
            messages,
            next_cursor,
        })
    }
}

/// What a poll returns to its caller: `None` when its credentials were not
/// accepted. Only a lease shows the lease's end.
fn inbox(polled: store::Polled, mode: InboxMode) -> Option<(i64, Inbox)> {
    let me_id = polled.me_id?;
    let mut messages = polled.messages;
    if !matches!(mode, InboxMode::Lease { .. }) {
        for m in &mut messages {
            m.leased_until = None;
        }
    }
    // A page of the history goes on from its oldest message.
    let next_cursor = polled
        .more
        .then(|| messages.last().map(|m| encode_history_cursor(m.id)))
        .flatten();
    Some((
        me_id,
        Inbox {
            messages,
            unread_remaining: polled.waiting.clamp(0, UNREAD_COUNT_CAP),
            acked: None,
            full: polled.full,
            next_cursor,
        },
    ))
}

/// A poll that loses its database connection may have committed before
/// the loss: the messages it took are read (a plain retry will not return
/// them), or leased (they come back when the lease ends). Say where they
/// are.
fn taken_hint(err: PhoneError, req: InboxRequest) -> PhoneError {
    match (err, req.mode) {
        // Refused before anything was done: nothing taken.
        (PhoneError::Unavailable(reason), InboxMode::Read) if reason != store::NO_SYNC_STANDBY => {
            PhoneError::Unavailable(format!(
                "{reason}; if this poll got through before the failure, what it took is marked read: \
             see phone_inbox include_read=true, or poll with mode=lease"
            ))
        }
        (PhoneError::Unavailable(reason), InboxMode::Lease { seconds, .. })
            if reason != store::NO_SYNC_STANDBY =>
        {
            PhoneError::Unavailable(format!(
                "{reason}; if this poll got through before the failure, what it leased comes back \
                 to a poll when its lease ends, within {seconds} s"
            ))
        }
        (other, _) => other,
    }
}

/// What phone_ack is given for one message: its id (acknowledges whatever
/// delivery is current) or the receipt of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckRef {
    Id(MessageId),
    Receipt(Receipt),
}

/// As the caller gave it: a message id, or a receipt.
impl std::fmt::Display for AckRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Id(id) => id.fmt(f),
            Self::Receipt(r) => r.fmt(f),
        }
    }
}

impl AckRef {
    pub fn message(&self) -> MessageId {
        match self {
            Self::Id(id) => *id,
            Self::Receipt(r) => r.message,
        }
    }

    fn delivery(&self) -> Option<i32> {
        match self {
            Self::Id(_) => None,
            Self::Receipt(r) => Some(r.delivery),
        }
    }
}

/// Parses the `ids` of phone_ack: message ids or receipts.
pub fn parse_ack_ids(raw: &[&str]) -> Result<Vec<AckRef>, InvalidInput> {
    if raw.is_empty() {
        return Err(InvalidInput::new(
            "ids",
            "must list at least one message id or receipt",
        ));
    }
    parse_ack_refs("ids", raw)
}

/// phone_inbox's `ack`: what to acknowledge before the poll. Only a lease
/// leaves anything to acknowledge; an empty list acknowledges nothing.
pub fn parse_inbox_acks(raw: &[&str], mode: InboxMode) -> Result<Vec<AckRef>, InvalidInput> {
    if !raw.is_empty() && !matches!(mode, InboxMode::Lease { .. }) {
        return Err(InvalidInput::new(
            "ack",
            "only applies with mode \"lease\" (other polls leave nothing to acknowledge); use phone_ack",
        ));
    }
    parse_ack_refs("ack", raw)
}

fn parse_ack_refs(field: &'static str, raw: &[&str]) -> Result<Vec<AckRef>, InvalidInput> {
    if raw.len() > ACK_IDS_MAX {
        return Err(InvalidInput::new(
            field,
            format!(
                "lists {} ids; acknowledge at most {ACK_IDS_MAX} per call",
                raw.len()
            ),
        ));
    }
    let mut refs: Vec<AckRef> = Vec::with_capacity(raw.len());
    for id in raw {
        let parsed = if id.trim().starts_with(Receipt::PREFIX) {
            Receipt::parse(field, id).map(AckRef::Receipt)?
        } else {
            MessageId::parse(field, id).map(AckRef::Id)?
        };
        // Listed twice, acknowledged once, and counted once.
        if !refs.contains(&parsed) {
            refs.push(parsed);
        }
    }
    Ok(refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease poll that failed after its commit (a frozen replica woken
    /// past its deadline) was told only "retry": its mail was leased, and
    /// came back minutes later to nobody's surprise but the caller's.
    #[test]
    fn a_failed_poll_says_where_what_it_may_have_taken_is() {
        let hint = |mode| {
            let req = InboxRequest {
                limit: 10,
                mode,
                wait: Duration::ZERO,
            };
            taken_hint(PhoneError::Unavailable("database unreachable".into()), req).to_string()
        };
        assert!(hint(InboxMode::Read).contains("include_read=true"));
        let lease = hint(InboxMode::Lease {
            seconds: 300,
            max_deliveries: 10,
        });
        assert!(
            lease.contains("comes back") && lease.contains("300 s"),
            "{lease}"
        );
        assert!(!hint(InboxMode::Peek).contains("comes back"));
    }
}
