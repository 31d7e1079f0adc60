//! Sends and read polls of one replica in one statement and one commit.
//!
//! Each kind used to be batched on its own: two statements and two commits
//! where one does, and with three replicas at 16 connections batches of
//! about 1.5 calls, so per-statement work (executor start-up, locks,
//! commit, WAL flush) dominated.

use super::{
    PendingWakes, Write,
    poll::{POLLERS, QueuedPoll, polls},
    send::{
        NOTIFY_SQL, QueuedSend, SENDERS, SendOutcome, WAKE_SQL, copy_key, other_copy_key, sends,
        waiting_among,
    },
};
use crate::store::fragments::{SENDER_LOOKUP, polled_message_columns, presence_write};
use crate::store::messages::Polled;
use std::sync::Arc;
use tokio_postgres::types::Type;

use tokio_util::sync::CancellationToken;

use crate::store::wakeup::Wakeup;
use crate::store::{Pool, StoreError};

/// One call of the mail statement.
pub(crate) enum MailCall {
    Send(QueuedSend),
    Poll(QueuedPoll),
}

/// What the mail statement did for one call.
pub(crate) enum MailDone {
    Sent(SendOutcome),
    Polled(Polled),
}

/// Writes batches of sends and read polls.
pub(crate) struct MailWrite {
    pub pool: Pool,
    /// Bounds the unread count a poll reports.
    pub cap: i64,
    /// Bounds the text a poll takes (see `poll::polls`).
    pub answer_bytes: i64,
    /// Recipients of committed sends to wake: each statement checks which
    /// of them wait, as it begins after their commit.
    pub wakes: PendingWakes,
    /// This replica's waiters, woken here when a NOTIFY fails.
    pub wakeup: Arc<Wakeup>,
    pub quotas: Quotas,
    /// Nudges this replica's webhook worker when a batch queued deliveries.
    pub webhooks_due: Arc<tokio::sync::Notify>,
    /// Where give-backs run (see `Store::give_back`).
    pub tasks: tokio_util::task::TaskTracker,
    /// Commit only where a synchronous standby confirms (`pool::standby`).
    pub require_sync_standby: bool,
}

/// Limits on sending, shared by every replica (0: off).
#[derive(Debug, Clone, Copy, Default)]
pub struct Quotas {
    /// Sends per sender per hour.
    pub sends_per_hour: i32,
    /// First messages to recipients a sender never wrote to before, per day.
    pub new_recipients_per_day: i32,
    /// Unread messages a recipient may hold from agents it does not know
    /// (twice that from those it does); a send beyond waits its turn.
    pub unread_max: i32,
    /// Unread messages one sender may hold in one inbox: no single sender
    /// can fill an inbox for everyone else.
    pub unread_per_sender: i32,
    /// Webhook deliveries pending per agent, at most: beyond, one "mail
    /// waits" delivery stands for the rest (at least 1).
    pub webhook_backlog: i32,
}

impl Quotas {
    /// Whether a send's quotas are looked at at all.
    fn any(&self) -> bool {
        self.sends_per_hour > 0
            || self.new_recipients_per_day > 0
            || self.unread_max > 0
            || self.unread_per_sender > 0
    }
}

impl Write for MailWrite {
    type Item = MailCall;
    type Outcome = MailDone;

    /// One statement for the whole batch; one outcome per call, in order.
    /// It also wakes the recipients of earlier batches (committed before it
    /// began); its own recipients wait for a later statement.
    async fn write(&self, calls: &[MailCall]) -> Result<Vec<MailDone>, StoreError> {
        // Where each send and each poll sits among the calls.
        let (mut sends, mut send_at) = (Vec::new(), Vec::new());
        let (mut polls, mut poll_at) = (Vec::new(), Vec::new());
        for (at, call) in calls.iter().enumerate() {
            match call {
                MailCall::Send(send) => {
                    sends.push(send);
                    send_at.push(at);
                }
                MailCall::Poll(poll) => {
                    polls.push(poll);
                    poll_at.push(at);
                }
            }
        }
        let client = self.pool.get().await?;
        let parts = Parts::of(&sends, &polls, self.quotas.any());
        let stmt = client
            .prepare_typed_cached(parts.sql(), &PARAM_TYPES)
            .await?;
        let tokens: Vec<&[u8]> = sends.iter().map(|s| s.token.as_slice()).collect();
        let claimed: Vec<Option<&str>> = sends.iter().map(|s| s.claimed.as_deref()).collect();
        let subjects: Vec<Option<&str>> = sends.iter().map(|s| s.subject.as_deref()).collect();
        let bodies: Vec<&str> = sends.iter().map(|s| s.body.as_str()).collect();
        let reply_tos: Vec<Option<i64>> = sends.iter().map(|s| s.reply_to).collect();
        let threads: Vec<Option<i64>> = sends.iter().map(|s| s.thread_id).collect();
        let lifetimes: Vec<Option<f64>> = sends.iter().map(|s| s.expires_in).collect();
        // One element per copy; `copy_of` finds each copy's send again.
        let copies = Copies::of(&sends);
        let q = self.quotas;
        let poll_tokens: Vec<&[u8]> = polls.iter().map(|p| p.token.as_slice()).collect();
        let poll_claimed: Vec<Option<&str>> = polls.iter().map(|p| p.claimed.as_deref()).collect();
        let limits: Vec<i64> = polls.iter().map(|p| p.limit).collect();
        let lease_secs: Vec<Option<f64>> = polls
            .iter()
            .map(|p| p.lease.map(|l| f64::from(l.seconds)))
            .collect();
        let max_deliveries: Vec<Option<i32>> = polls
            .iter()
            .map(|p| {
                p.lease
                    .map(|l| i32::try_from(l.max_deliveries).unwrap_or(i32::MAX))
            })
            .collect();
        // One element per acknowledgement, each with its poll's place.
        let (mut ack_polls, mut ack_ids, mut ack_deliveries) = (Vec::new(), Vec::new(), Vec::new());
        for (n, poll) in polls.iter().enumerate() {
            for &(id, delivery) in &poll.acks {
                ack_polls.push(n as i64 + 1);
                ack_ids.push(id);
                ack_deliveries.push(delivery);
            }
        }
        let to_wake = self.wakes.take();
        let params: &[&(dyn tokio_postgres::types::ToSql + Sync)] = &[
            &tokens,
            &claimed,
            &copies.names,
            &subjects,
            &bodies,
            &reply_tos,
            &threads,
            &copies.keys,
            &copies.ids,
            &poll_tokens,
            &poll_claimed,
            &limits,
            &self.cap,
            &to_wake,
            &lease_secs,
            &max_deliveries,
            &copies.answers,
            &q.sends_per_hour,
            &q.new_recipients_per_day,
            &q.unread_max,
            &q.unread_per_sender,
            &q.webhook_backlog,
            &lifetimes,
            &copies.send,
            &ack_polls,
            &ack_ids,
            &ack_deliveries,
            &self.answer_bytes,
            &copies.other_keys,
        ];
        let written = if self.require_sync_standby {
            client.query_generic_on_standby(&stmt, params).await
        } else {
            client.query_generic(&stmt, params).await
        };
        let rows = match written {
            Ok(rows) => rows,
            Err(e) => {
                self.wakes.add(to_wake);
                return Err(e);
            }
        };
        let mut done: Vec<MailDone> = calls
            .iter()
            .map(|call| match call {
                MailCall::Send(send) => MailDone::Sent(SendOutcome::not_accepted(send.to.len())),
                MailCall::Poll(_) => MailDone::Polled(Polled::default()),
            })
            .collect();
        let mut stored_for = Vec::new();
        let mut to_notify = Vec::new();
        let mut hooked = false;
        for row in &rows {
            // Rows of neither kind name a waiting recipient to notify.
            let Some(is_poll) = row.get::<_, Option<bool>>("is_poll") else {
                if let Some(agent) = row.get::<_, Option<i64>>("recipient_id") {
                    to_notify.push(agent);
                }
                continue;
            };
            let ord: i64 = row.get("ord");
            let Ok(i) = usize::try_from(ord - 1) else {
                continue;
            };
            // A send's row is one of its copies.
            let (call, copy) = if is_poll {
                (poll_at.get(i).copied(), 0)
            } else {
                match copies.copy_of.get(i) {
                    Some(&(send, copy)) => (send_at.get(send).copied(), copy),
                    None => (None, 0),
                }
            };
            let Some(outcome) = call.and_then(|at| done.get_mut(at)) else {
                continue;
            };
            match outcome {
                MailDone::Polled(polled) => match row.get::<_, Option<&str>>("ack_state") {
                    Some(state) => polled.add_ack_row(state, row),
                    None => polled.add_row(row),
                },
                MailDone::Sent(sent) => {
                    if row.get::<_, Option<bool>>("hooked") == Some(true) {
                        hooked = true;
                    }
                    sent.add_row(copy, row);
                    if let Some(recipient) = row.get::<_, Option<i64>>("recipient_id") {
                        stored_for.push(recipient);
                    }
                }
            }
        }
        for outcome in &mut done {
            let MailDone::Polled(polled) = outcome else {
                continue;
            };
            // The statement returns rows in no order; a poll's messages go
            // out in inbox order (oldest first).
            polled.messages.sort_unstable_by_key(|m| m.id);
            // A poll that stopped at its byte budget held the rest of its
            // inbox's mail locked while it ran: polls of that inbox on other
            // connections skipped it and may have gone to wait. Wake them as
            // for new mail.
            if polled.waiting > 0
                && text_bytes(&polled.messages) >= self.answer_bytes
                && let Some(agent) = polled.me_id
            {
                polled.full = true;
                stored_for.push(agent);
            }
        }
        self.wakes.add(stored_for);
        if hooked {
            // This replica's webhook worker looks at once (any replica's
            // would find the delivery on its own next look).
            self.webhooks_due.notify_one();
        }
        if !to_notify.is_empty() {
            // In a transaction of its own: a NOTIFY that fails (a full
            // notification queue, say) fails only the wake-ups.
            let (pool, wakeup) = (self.pool.clone(), self.wakeup.clone());
            tokio::spawn(async move { notify(&pool, &wakeup, &to_notify).await });
        }
        Ok(done)
    }

    /// A read poll whose caller left while its statement ran: its messages
    /// go back to unread (off the request's path; nobody waits for it).
    fn abandoned(&self, outcome: MailDone) {
        if let MailDone::Polled(polled) = outcome
            && !polled.messages.is_empty()
        {
            let (pool, wakeup) = (self.pool.clone(), self.wakeup.clone());
            self.tasks
                .spawn(async move { give_back(&pool, &wakeup, &polled).await });
        }
    }

    fn has_follow_up(&self) -> bool {
        !self.wakes.is_empty()
    }

    /// Wakes the waiters of what the last batches stored, in a statement
    /// that began after their commit, when no batch took them along.
    async fn follow_up(&self) {
        let to_wake = self.wakes.take();
        if to_wake.is_empty() {
            return;
        }
        wake_waiting(&self.pool, &self.wakeup, &to_wake).await;
    }
}

/// The copies of a batch's sends, one element per recipient, as the mail
/// statement's per-copy arrays take them.
struct Copies<'a> {
    /// The send each copy belongs to (1-based, as the statement numbers
    /// sends).
    send: Vec<i64>,
    names: Vec<&'a str>,
    ids: Vec<Option<i64>>,
    answers: Vec<bool>,
    keys: Vec<Option<String>>,
    /// Each key in the form a send to one (or to several) would have given
    /// it: `other_copy_key`.
    other_keys: Vec<Option<String>>,
    /// For each copy (0-based, in order): its send's place among the sends
    /// and its place among that send's recipients.
    copy_of: Vec<(usize, usize)>,
}

impl<'a> Copies<'a> {
    fn of(sends: &[&'a QueuedSend]) -> Self {
        let mut copies = Self {
            send: Vec::new(),
            names: Vec::new(),
            ids: Vec::new(),
            answers: Vec::new(),
            keys: Vec::new(),
            other_keys: Vec::new(),
            copy_of: Vec::new(),
        };
        for (n, send) in sends.iter().enumerate() {
            for (c, to) in send.to.iter().enumerate() {
                copies.send.push(n as i64 + 1);
                copies.names.push(&to.name);
                copies.ids.push(to.id);
                copies.answers.push(to.answers_recipient);
                let key = send.idempotency_key.as_deref();
                copies
                    .keys
                    .push(key.map(|k| copy_key(k, &to.name, send.to.len())));
                copies
                    .other_keys
                    .push(key.map(|k| other_copy_key(k, &to.name, send.to.len())));
                copies.copy_of.push((n, c));
            }
        }
        copies
    }
}

/// The text of `messages` in bytes, as a poll's byte budget counts it.
fn text_bytes(messages: &[crate::store::rows::Message]) -> i64 {
    messages
        .iter()
        .map(crate::store::rows::Message::text_bytes)
        .sum()
}

/// Notifies every replica that mail for `agents` (who wait) arrived.
async fn notify(pool: &Pool, wakeup: &Wakeup, agents: &[i64]) {
    let outcome = async {
        let client = pool.get().await?;
        let stmt = client.prepare_cached(&NOTIFY_SQL).await?;
        client.query(&stmt, &[&agents]).await?;
        Ok::<_, StoreError>(())
    }
    .await;
    if let Err(e) = outcome {
        wake_failed(wakeup, agents, &e);
    }
}

/// Puts back what a poll whose caller left took, until it lands, and wakes
/// the long polls of that inbox, as a send does: one waiting beside the
/// caller that left would otherwise get the mail only at its next look or
/// at the end of its wait.
pub(crate) async fn give_back(pool: &Pool, wakeup: &Wakeup, polled: &Polled) {
    let back = crate::store::messages::give_back_until_landed(pool, polled).await;
    if let (true, Some(recipient)) = (back, polled.me_id) {
        wake_waiting(pool, wakeup, &[recipient]).await;
    }
}

/// Wakes the long polls of `agents` that wait, on every replica (here
/// directly when the NOTIFY fails).
async fn wake_waiting(pool: &Pool, wakeup: &Wakeup, agents: &[i64]) {
    let outcome = async {
        let client = pool.get().await?;
        let stmt = client.prepare_cached(&WAKE_SQL).await?;
        client.query(&stmt, &[&agents]).await?;
        Ok::<_, StoreError>(())
    }
    .await;
    if let Err(e) = outcome {
        wake_failed(wakeup, agents, &e);
    }
}

/// Wake-ups that could not go out: this replica's own waiters of `agents`
/// look at once; the others look again when their wait ends (mail stays
/// where it is; only the wake-up is late).
fn wake_failed(wakeup: &Wakeup, agents: &[i64], e: &StoreError) {
    tracing::warn!(error = %e, agents = agents.len(), "could not wake waiting pollers");
    for agent in agents {
        wakeup.wake_here(*agent);
    }
}

impl super::Batcher<MailWrite> {
    pub async fn send(
        &self,
        send: QueuedSend,
        gone: CancellationToken,
    ) -> Result<SendOutcome, StoreError> {
        match self.run(MailCall::Send(send), gone).await? {
            MailDone::Sent(outcome) => Ok(outcome),
            MailDone::Polled(_) => Err(StoreError::BatchLost),
        }
    }

    pub async fn poll(
        &self,
        poll: QueuedPoll,
        gone: CancellationToken,
    ) -> Result<Polled, StoreError> {
        match self.run(MailCall::Poll(poll), gone).await? {
            MailDone::Polled(outcome) => Ok(outcome),
            MailDone::Sent(_) => Err(StoreError::BatchLost),
        }
    }
}

/// Which parts of the mail statement a batch uses: a statement holds only
/// those. Every part of a statement is set up on each execution, whether or
/// not it runs (~250 plan nodes initialised for the whole statement): in
/// pgbench on this machine, a read poll alone took 0.46 ms in the statement
/// for sends and polls and 0.21 ms in its own, a send alone 0.95 and 0.81
/// ms (bench/RESULTS.md). Each shape is its own prepared statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Parts {
    pub sends: bool,
    pub polls: bool,
    /// Lease polls among the polls.
    pub leases: bool,
    /// Lease polls that acknowledge first.
    pub acks: bool,
    /// Sends to several recipients: their copies form groups, and with a
    /// key, a retry's copies join the first try's group. Without, each copy
    /// is stored as it is.
    pub grouped: bool,
    /// Sends with an idempotency key: a copy may find its earlier one (a
    /// retry), and the insert skips what conflicts. Without, no insert is
    /// speculative (an insert with ON CONFLICT writes and confirms each row
    /// apart).
    pub keyed: bool,
    /// A quota is on (the server's settings): without, the statement holds
    /// none of their parts (~19% of a batch of 4 sends and 4 polls in
    /// pgbench, set up on every execution even when skipped).
    pub quotas: bool,
}

impl Parts {
    /// The shape of a batch of these sends and polls, under quotas on or
    /// off.
    fn of(sends: &[&QueuedSend], polls: &[&QueuedPoll], quotas: bool) -> Self {
        Self {
            sends: !sends.is_empty(),
            polls: !polls.is_empty(),
            leases: polls.iter().any(|poll| poll.lease.is_some()),
            acks: polls.iter().any(|poll| !poll.acks.is_empty()),
            grouped: sends.iter().any(|send| send.to.len() > 1),
            keyed: sends.iter().any(|send| send.idempotency_key.is_some()),
            quotas: quotas && !sends.is_empty(),
        }
    }

    /// The statement for this shape, built on first use.
    pub(crate) fn sql(self) -> &'static str {
        static SHAPES: [std::sync::OnceLock<String>; 128] =
            [const { std::sync::OnceLock::new() }; 128];
        let at = usize::from(self.sends)
            | usize::from(self.polls) << 1
            | usize::from(self.leases) << 2
            | usize::from(self.acks) << 3
            | usize::from(self.keyed) << 4
            | usize::from(self.quotas) << 5
            | usize::from(self.grouped) << 6;
        SHAPES[at].get_or_init(|| mail_batch_sql(self))
    }
}

/// Every mail statement a batch can run, with its parameters' types, for a
/// test that runs each: a shape whose statement fails would not fail its
/// calls (a refused batch runs again call by call, in shapes of one), only
/// make them slower.
pub fn every_mail_statement() -> Vec<(&'static str, &'static [Type])> {
    let mut shapes = Vec::new();
    for bits in 0..128u8 {
        let bit = |n: u8| bits & (1 << n) != 0;
        let parts = Parts {
            sends: bit(0),
            polls: bit(1),
            leases: bit(2),
            acks: bit(3),
            keyed: bit(4),
            quotas: bit(5),
            grouped: bit(6),
        };
        // The shapes `Parts::of` can give: some calls; lease and
        // acknowledgement bits only with polls (acknowledgements come with
        // lease polls, but nothing here relies on it); key, group and quota
        // bits only with sends.
        let none = !parts.sends && !parts.polls;
        let stray_poll_bits = !parts.polls && (parts.leases || parts.acks);
        let stray_send_bits = !parts.sends && (parts.keyed || parts.quotas || parts.grouped);
        if !(none || stray_poll_bits || stray_send_bits) {
            shapes.push((parts.sql(), &PARAM_TYPES[..]));
        }
    }
    shapes
}

/// The mail statement's parameters, declared: a shape without sends or
/// without polls does not mention theirs, and PostgreSQL could not infer
/// their types.
const PARAM_TYPES: [Type; 29] = [
    Type::BYTEA_ARRAY,  // $1 tokens of the senders
    Type::TEXT_ARRAY,   // $2 claimed names
    Type::TEXT_ARRAY,   // $3 recipient names, per copy
    Type::TEXT_ARRAY,   // $4 subjects
    Type::TEXT_ARRAY,   // $5 bodies
    Type::INT8_ARRAY,   // $6 reply_to
    Type::INT8_ARRAY,   // $7 threads
    Type::TEXT_ARRAY,   // $8 idempotency keys, per copy
    Type::INT8_ARRAY,   // $9 recipient ids, per copy
    Type::BYTEA_ARRAY,  // $10 tokens of the pollers
    Type::TEXT_ARRAY,   // $11 claimed names
    Type::INT8_ARRAY,   // $12 limits
    Type::INT8,         // $13 the unread count's cap
    Type::INT8_ARRAY,   // $14 recipients to wake
    Type::FLOAT8_ARRAY, // $15 lease seconds
    Type::INT4_ARRAY,   // $16 max deliveries
    Type::BOOL_ARRAY,   // $17 answers its recipient, per copy
    Type::INT4,         // $18 sends per hour
    Type::INT4,         // $19 new recipients per day
    Type::INT4,         // $20 unread per inbox
    Type::INT4,         // $21 unread per sender
    Type::INT4,         // $22 webhook backlog
    Type::FLOAT8_ARRAY, // $23 lifetimes
    Type::INT8_ARRAY,   // $24 the send of each copy
    Type::INT8_ARRAY,   // $25 the poll of each acknowledgement
    Type::INT8_ARRAY,   // $26 the message each acknowledges
    Type::INT4_ARRAY,   // $27 the delivery its receipt names
    Type::INT8,         // $28 the text a poll takes, in bytes
    Type::TEXT_ARRAY,   // $29 idempotency keys in their other form, per copy
];

/// The mail statement for the parts `parts` names. `$1`-`$9`, `$17`-`$24`
/// and `$29` the sends (see `sends`), `$10` token digests, `$11` claimed names, `$12`
/// limits, `$15` lease seconds and `$16` max deliveries (NULL for read
/// polls) of the polls (arrays, one element per call), `$13` the unread
/// count's cap, `$14` recipients of committed sends to wake: which of them
/// wait comes back as rows with a NULL `is_poll`; the NOTIFY itself runs in
/// a statement of its own, so that it cannot fail the mail. It runs only
/// its generic plan (`Client::query_generic`), which knows no parameter's
/// value; see `sends` on why the parameters are bare (all but `$14`, which
/// `waiting_among` shares with `WAKE_SQL`, run on custom plans). `$25`-`$27`
/// what lease polls acknowledge first (see `poll::ack_ctes`), `$28` the
/// text one poll takes, in bytes. One row per send,
/// and per poll one per message taken (or one without a message), and one
/// per acknowledgement (`ack_state` not NULL), in no order: the caller
/// puts each poll's messages in inbox order (a Sort of every row, bodies
/// and all, was ~4% of a batch of 4 sends and 4 polls in pgbench).
fn mail_batch_sql(parts: Parts) -> String {
    // The polls' or the sends' rows come first and name the columns.
    debug_assert!(parts.sends || parts.polls, "a batch of no calls");
    let mut ctes = vec![format!("woken AS ({})", waiting_among("$14"))];
    let mut callers = Vec::new();
    let mut rows = Vec::new();
    if parts.sends {
        ctes.push(sends(parts.keyed, parts.grouped, parts.quotas));
        callers.push(SENDERS);
    }
    if parts.polls {
        ctes.push(
            "preq AS (
             SELECT * FROM unnest($10::bytea[], $11::text[], $12::bigint[], $15::float8[], $16::int[])
                 WITH ORDINALITY AS r(token, claimed, lim, lease_secs, max_deliveries, ord))"
                .to_owned(),
        );
        ctes.push(polls(parts.leases, parts.acks));
        callers.push(POLLERS);
        let columns = polled_message_columns("me.name");
        rows.push(format!(
            "SELECT true AS is_poll, me.ord, me.id AS me_id, {columns},
                waiting.n - waiting.taken AS waiting, NULL::bigint AS recipient_id,
                NULL::text AS refusal, NULL::bool AS hooked,
                NULL::bigint AS ack_n, NULL::text AS ack_state, NULL::int AS ack_current
         FROM me
         JOIN waiting ON waiting.agent = me.id
         LEFT JOIN (SELECT picked.ord, taken.* FROM taken JOIN picked ON picked.id = taken.id) m
             ON m.ord = me.ord
         {SENDER_LOOKUP}"
        ));
    }
    ctes.push(format!(
        "touched AS ({})",
        presence_write(&callers.join(" UNION ALL "))
    ));
    if parts.sends {
        // Without keys every copy stored went in (no insert can conflict).
        let took = if parts.keyed {
            "coalesce(s.id IN (SELECT id FROM inserted), false)"
        } else {
            "s.id IS NOT NULL"
        };
        // Named as the polls' rows are: first when no poll is in the batch.
        rows.push(format!(
            "SELECT false AS is_poll, z.ord, z.sender_id AS me_id, CASE WHEN z.took THEN z.id END AS id,
                NULL AS sender, NULL AS sender_project, NULL AS recipient, NULL AS subject,
                NULL AS body, NULL AS reply_to, CASE WHEN z.took THEN z.thread_id END AS thread_id,
                CASE WHEN z.took THEN now() END AS sent_at, NULL AS read_at,
                NULL AS delivery_count, NULL AS leased_until, NULL AS dead_at, NULL AS expires_at,
                CASE WHEN z.took THEN z.group_id END AS group_id, NULL AS also_to, NULL AS waiting,
                CASE WHEN z.took THEN z.recipient_id END AS recipient_id, z.refusal,
                z.hooked AND z.took AS hooked,
                NULL::bigint AS ack_n, NULL::text AS ack_state, NULL::int AS ack_current
         FROM (SELECT rs.ord, rs.sender_id, rs.hooked, d.refusal, s.id, s.thread_id, s.group_id,
                      s.recipient_id,
                      -- stored, not an idempotent replay (`sent_at` is the
                      -- insert's default, the statement's now())
                      {took} AS took
               FROM resolved rs
               JOIN decided d ON d.ord = rs.ord
               LEFT JOIN stored s ON s.ord = rs.ord) z"
        ));
    }
    // Read by every shape, so the check always runs.
    rows.push(
        "SELECT NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, w.agent_id, NULL, NULL,
                NULL, NULL, NULL
         FROM woken CROSS JOIN unnest(woken.ids) AS w(agent_id)"
            .to_owned(),
    );
    if parts.acks {
        rows.push(
            "SELECT true, a.ord, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                a.n, a.state, a.current
         FROM ack_outcomes a"
                .to_owned(),
        );
    }
    format!(
        "WITH {}
         {}",
        ctes.join(",\n"),
        rows.join("\n         UNION ALL\n         ")
    )
}
