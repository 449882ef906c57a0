//! The conformance suite every queue backend must pass: waiting room, tokens, claims, jobs and limiter.
//!
//! Each check is a public async function taking a fresh [`Backend`]; [`queue_conformance_suite!`]
//! expands to one `#[tokio::test]` per check for a backend factory, so embedded, Redis and Redis Cluster
//! run exactly the same assertions (the quickwit `metastore_test_suite!` pattern). Time is a
//! [`ManualClock`] shared with the backend; nothing sleeps.
//!
//! [`queue_conformance_suite!`]: crate::queue_conformance_suite

use std::any::Any;
use std::sync::Arc;

use rankgate_core::ids::MemberId;
use rankgate_core::job::RetryPolicy;
use rankgate_core::limiter::{RateDecision, RateLimit};
use rankgate_core::queue::{
    ClaimRejection, ConsumeRejection, MemberStatus, QueueName, QueueSettings, RefusalReason,
    ReleaseRejection, ReleasedTo, SettingsPatch,
};

use super::jobs::{JobAckOutcome, JobStore, NackOutcome, NewJob};
use super::limiter::{RateLimiter, RateLimiterKind};
use super::report::{ReportDelta, ReportField, ReportStore, REPORT_MINUTES_KEPT};
use super::token::{digest_of, new_claim_id, TokenSecret};
use super::waiting::{
    ClaimOutcome, ConsumeOutcome, EnterOutcome, LeaveOutcome, QueueStore, ReleaseOutcome, TokenCandidate,
};
use crate::clock::{Clock, ManualClock};

/// A backend under test: its three capabilities, the clock it reads, and whatever keeps it alive.
pub struct Backend {
    /// Waiting-room storage.
    pub queues: Arc<dyn QueueStore>,
    /// Job storage.
    pub jobs: Arc<dyn JobStore>,
    /// Rate limiter.
    pub limiter: Arc<dyn RateLimiter>,
    /// The clock the backend reads.
    pub clock: ManualClock,
    /// Temp dirs, key prefixes to clean up, …
    pub guard: Box<dyn Any + Send>,
}

/// Expands to one `#[tokio::test]` per conformance check, each given `$make().await` (a fresh [`Backend`]).
#[macro_export]
macro_rules! queue_conformance_suite {
    ($make:path) => {
        $crate::queue_conformance_suite!(@tests $make;
            entry_is_atomic_and_idempotent,
            order_is_strict_fifo_by_store_sequence,
            admission_budget_is_global_across_schedulers,
            admission_pops_and_issues_tokens_in_one_step,
            one_token_buys_one_order,
            release_and_consume_agree_on_claim_ids,
            only_busy_queues_are_active,
            first_entries_create_at_most_max_queues,
            deleted_queues_are_gone_with_their_members,
            idle_auto_created_queues_are_forgotten,
            reads_record_the_clock_guard_only_when_they_read_a_token,
            ten_thousand_due_tokens_expire_in_bounded_steps,
            abandoned_claims_are_released_after_claim_ttl,
            waiting_members_unseen_for_abandon_after_seconds_are_dropped_before_admission,
            expired_tokens_free_their_slot_under_max_active,
            leave_removes_waiting_and_ready_members,
            settings_update_partially_and_reject_invalid_values,
            adaptive_settings_round_trip_and_clamp_the_rate,
            stats_report_counts_oldest_wait_and_admissions,
            wait_estimate_follows_measured_rate,
            wait_estimate_is_right_after_opening_and_resuming,
            jobs_claim_ack_retry_reap_and_dead_letter,
            a_retry_waits_at_least_its_minimum_delay_within_the_cap,
            a_paused_group_parks_its_jobs_until_resumed,
            each_job_queue_has_its_own_clock_guard_moved_by_every_step,
            sliding_log_limits_and_caps,
            sliding_window_counter_limits,
            each_limiter_key_has_its_own_clock_guard,
            admission_answers_each_members_wait_from_its_arrival,
            sale_reports_add_up_across_writers_and_outlive_the_queue,
            sale_reports_keep_seven_days_and_at_most_max_reports,
        );
    };
    (@tests $make:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $crate::queue::conformance::$name($make().await).await;
            }
        )*
    };
}

fn queue(name: &str) -> QueueName {
    QueueName::parse(name).expect("valid queue name")
}

fn member(name: &str) -> MemberId {
    MemberId::parse(name).expect("valid member id")
}

fn tokens(secret: &TokenSecret, count: usize) -> Vec<TokenCandidate> {
    (0..count).map(|_| secret.prepare().expect("os rng")).collect()
}

async fn ready_token(backend: &Backend, secret: &TokenSecret, q: &QueueName, m: &MemberId) -> String {
    let view = backend.queues.position(q, m).await.unwrap();
    assert_eq!(view.status, MemberStatus::Ready, "{m:?} should be READY");
    let (nonce, _) = view.token.expect("a READY member has a token");
    secret.token_for(&nonce)
}

/// Limitation 1: fifty concurrent first entries of one member produce exactly one position.
pub async fn entry_is_atomic_and_idempotent(backend: Backend) {
    let q = queue("atomic-entry");
    let m = member("m-1");
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let store = Arc::clone(&backend.queues);
        let (q, m) = (q.clone(), m.clone());
        tasks.push(tokio::spawn(async move { store.enter(&q, &m).await.unwrap() }));
    }
    let mut entered = 0;
    for task in tasks {
        let outcome = task.await.unwrap();
        if matches!(outcome, EnterOutcome::Entered(_)) {
            entered += 1;
        }
        assert_eq!(outcome.view().rank, Some(0));
        assert_eq!(outcome.view().waiting_count, 1);
    }
    assert_eq!(entered, 1, "exactly one entry creates the position");
    backend.queues.enter(&q, &member("m-2")).await.unwrap();
    let again = backend.queues.enter(&q, &m).await.unwrap();
    assert!(matches!(again, EnterOutcome::AlreadyPresent(_)));
    assert_eq!(again.view().rank, Some(0), "re-entering keeps the first position");
}

/// Limitation 6: members arriving in the same millisecond keep their arrival order, whatever their ids
/// (a millisecond score would tie and Redis would order the ties by member bytes).
pub async fn order_is_strict_fifo_by_store_sequence(backend: Backend) {
    let q = queue("fifo");
    let names: Vec<MemberId> = (0..20).rev().map(|i| member(&format!("member-{i:02}"))).collect();
    for m in &names {
        backend.queues.enter(&q, m).await.unwrap();
    }
    for (expected, m) in names.iter().enumerate() {
        let view = backend.queues.position(&q, m).await.unwrap();
        assert_eq!(view.rank, Some(expected as u64), "{m:?}");
    }
    // A member who entered earlier stays ahead even when the clock steps back.
    backend.clock.set(backend.clock.now_millis() - 60_000);
    backend.queues.enter(&q, &member("late")).await.unwrap();
    assert_eq!(
        backend.queues.position(&q, &member("late")).await.unwrap().rank,
        Some(20)
    );
}

/// Limitation 3: three schedulers ticking on the same queue admit no more than the global rate.
pub async fn admission_budget_is_global_across_schedulers(backend: Backend) {
    let q = queue("global");
    let secret = TokenSecret::generate().unwrap();
    for i in 0..2_000 {
        backend
            .queues
            .enter(&q, &member(&format!("m-{i}")))
            .await
            .unwrap();
    }
    let patch = SettingsPatch {
        admit_per_second: Some(20.0),
        tick_millis: Some(1000),
        ..SettingsPatch::default()
    };
    backend.queues.update_settings(&q, &patch).await.unwrap().unwrap();
    let mut admitted = 0;
    for second in 0..10 {
        // Three instances tick, each offering a full tick's worth of tokens, at slightly different moments.
        for offset in [0, 300, 600] {
            let now = backend.clock.now_millis();
            backend.clock.set(now - now % 1000 + offset);
            admitted += backend
                .queues
                .admit(&q, tokens(&secret, 20))
                .await
                .unwrap()
                .admitted
                .len();
        }
        backend
            .clock
            .set(backend.clock.now_millis() - backend.clock.now_millis() % 1000 + 1000);
        let _ = second;
    }
    // ~10 s at 20/s, plus at most one tick's burst.
    assert!(admitted <= 20 * 10 + 20, "admitted {admitted}");
    assert!(
        admitted >= 20 * 9,
        "admitted {admitted}: the budget must not starve either"
    );
}

/// Limitation 2: the pop and the token issue are one step; every popped member is READY right away,
/// nobody is NOT_ENTERED, and the count of members is conserved.
pub async fn admission_pops_and_issues_tokens_in_one_step(backend: Backend) {
    let q = queue("atomic-admit");
    let secret = TokenSecret::generate().unwrap();
    let members: Vec<MemberId> = (0..120).map(|i| member(&format!("m-{i}"))).collect();
    for m in &members {
        backend.queues.enter(&q, m).await.unwrap();
    }
    let outcome = backend.queues.admit(&q, tokens(&secret, 50)).await.unwrap();
    assert_eq!(outcome.admitted.len(), 50);
    assert_eq!(outcome.admitted, members[..50].to_vec(), "admitted in FIFO order");
    let mut ready = 0;
    let mut waiting = 0;
    for m in &members {
        match backend.queues.position(&q, m).await.unwrap().status {
            MemberStatus::Ready => ready += 1,
            MemberStatus::Waiting => waiting += 1,
            other => panic!("{m:?} is {other:?}: lost between pop and token"),
        }
    }
    assert_eq!((ready, waiting), (50, 70));
    // Fewer tokens than budget: only as many are popped as can be issued.
    backend.clock.advance(1000);
    let outcome = backend.queues.admit(&q, tokens(&secret, 5)).await.unwrap();
    assert_eq!(outcome.admitted.len(), 5);
    assert_eq!(outcome.waiting, 65);
}

/// Issue 12, abandonment: a waiting member who neither polled nor entered again for
/// `abandon_after_seconds` is dropped before admission (no token, no `max_active` slot), counted in the
/// stats; one who came back within the period keeps its place. Every backend, with the manual clock.
pub async fn waiting_members_unseen_for_abandon_after_seconds_are_dropped_before_admission(backend: Backend) {
    let q = queue("abandon");
    let secret = TokenSecret::generate().unwrap();
    let patch = SettingsPatch {
        abandon_after_seconds: Some(10),
        paused: Some(true),
        max_active: Some(Some(1)),
        ..SettingsPatch::default()
    };
    backend.queues.update_settings(&q, &patch).await.unwrap().unwrap();
    let (gone, polling, returning) = (member("gone"), member("polling"), member("returning"));
    for m in [&gone, &polling, &returning] {
        backend.queues.enter(&q, m).await.unwrap();
    }
    // 6 s: `polling` polls, `returning` enters again; 12 s: `gone` is 12 s unseen, the others 6 s.
    backend.clock.advance(6_000);
    assert_eq!(backend.queues.position(&q, &polling).await.unwrap().rank, Some(1));
    backend.queues.enter(&q, &returning).await.unwrap();
    backend.clock.advance(6_000);
    let resume = SettingsPatch {
        paused: Some(false),
        ..SettingsPatch::default()
    };
    backend
        .queues
        .update_settings(&q, &resume)
        .await
        .unwrap()
        .unwrap();
    let outcome = backend.queues.admit(&q, tokens(&secret, 1)).await.unwrap();
    assert_eq!(
        outcome.admitted,
        vec![polling.clone()],
        "the abandoned head got no token and no max_active slot"
    );
    assert_eq!(
        outcome.abandoned, 1,
        "the step says how many it dropped (the sale report counts them)"
    );
    assert_eq!(outcome.waiting, 1);
    let view = backend.queues.position(&q, &gone).await.unwrap();
    assert_eq!(view.status, MemberStatus::NotEntered, "dropped");
    assert_eq!(
        backend.queues.position(&q, &returning).await.unwrap().rank,
        Some(0)
    );
    let stats = backend.queues.stats(&q).await.unwrap().unwrap();
    assert_eq!((stats.abandoned, stats.waiting), (1, 1));
    // A READY member is not abandoned by silence (its token has its own lifetime), and one who keeps
    // polling is never dropped.
    for _ in 0..4 {
        backend.clock.advance(5_000);
        assert_eq!(
            backend.queues.position(&q, &returning).await.unwrap().rank,
            Some(0)
        );
        backend.queues.expire_due(&q).await.unwrap();
    }
    assert_eq!(
        backend.queues.position(&q, &polling).await.unwrap().status,
        MemberStatus::Ready
    );
    let stats = backend.queues.stats(&q).await.unwrap().unwrap();
    assert_eq!((stats.abandoned, stats.waiting), (1, 1));
    // Silent past the period and its slack (a twentieth: 500 ms): dropped by the expiry sweep too, not
    // only by admission.
    // (Stats, not a position: reading the position would be a sign of life.)
    backend.clock.advance(10_499);
    backend.queues.expire_due(&q).await.unwrap();
    let stats = backend.queues.stats(&q).await.unwrap().unwrap();
    assert_eq!(
        (stats.abandoned, stats.waiting),
        (1, 1),
        "not before abandonAfterSeconds and the slack"
    );
    backend.clock.advance(1);
    backend.queues.expire_due(&q).await.unwrap();
    assert_eq!(
        backend.queues.position(&q, &returning).await.unwrap().status,
        MemberStatus::NotEntered
    );
    assert_eq!(backend.queues.stats(&q).await.unwrap().unwrap().abandoned, 2);
}

/// Limitation 4: claim, consume, release; fifty concurrent claims of one token, exactly one wins.
pub async fn one_token_buys_one_order(backend: Backend) {
    let q = queue("one-order");
    let secret = TokenSecret::generate().unwrap();
    let m = member("buyer");
    backend.queues.enter(&q, &m).await.unwrap();
    backend.queues.admit(&q, tokens(&secret, 50)).await.unwrap();
    let token = ready_token(&backend, &secret, &q, &m).await;
    let token_digest = digest_of(&token);

    let wrong = digest_of("not-the-token");
    let (_, claim_digest) = new_claim_id().unwrap();
    assert_eq!(
        backend.queues.claim(&q, &m, &wrong, &claim_digest).await.unwrap(),
        ClaimOutcome::Rejected(ClaimRejection::WrongToken)
    );

    let mut tasks = Vec::new();
    for _ in 0..50 {
        let store = Arc::clone(&backend.queues);
        let (q, m) = (q.clone(), m.clone());
        tasks.push(tokio::spawn(async move {
            let (_, claim) = new_claim_id().unwrap();
            (store.claim(&q, &m, &token_digest, &claim).await.unwrap(), claim)
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        let (outcome, claim) = task.await.unwrap();
        match outcome {
            ClaimOutcome::Claimed { .. } => winners.push(claim),
            ClaimOutcome::Rejected(rejection) => assert_eq!(rejection, ClaimRejection::AlreadyClaimed),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one concurrent claim wins");
    let claim = winners[0];
    assert_eq!(
        backend.queues.position(&q, &m).await.unwrap().status,
        MemberStatus::Claimed
    );

    // The order failed: back to READY, claimable again.
    assert_eq!(
        backend.queues.release(&q, &m, &claim).await.unwrap(),
        ReleaseOutcome::Released(ReleasedTo::Ready)
    );
    assert_eq!(
        backend.queues.position(&q, &m).await.unwrap().status,
        MemberStatus::Ready
    );
    let (_, second) = new_claim_id().unwrap();
    assert!(matches!(
        backend
            .queues
            .claim(&q, &m, &token_digest, &second)
            .await
            .unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    assert_eq!(
        backend.queues.consume(&q, &m, &claim).await.unwrap(),
        ConsumeOutcome::Rejected(ConsumeRejection::UnknownClaim),
        "the released claim cannot consume"
    );
    assert_eq!(
        backend.queues.consume(&q, &m, &second).await.unwrap(),
        ConsumeOutcome::Consumed
    );
    assert_eq!(
        backend.queues.consume(&q, &m, &second).await.unwrap(),
        ConsumeOutcome::AlreadyConsumed
    );
    assert_eq!(
        backend.queues.release(&q, &m, &second).await.unwrap(),
        ReleaseOutcome::Rejected(ReleaseRejection::AlreadyConsumed)
    );
    let (_, third) = new_claim_id().unwrap();
    assert_eq!(
        backend.queues.claim(&q, &m, &token_digest, &third).await.unwrap(),
        ClaimOutcome::Rejected(ClaimRejection::AlreadyConsumed),
        "a consumed token buys nothing more"
    );
    let view = backend.queues.position(&q, &m).await.unwrap();
    assert_eq!(view.status, MemberStatus::NotEntered);
    assert_eq!(view.last_outcome, Some(super::waiting::LastOutcome::Consumed));
}

/// Defect 15: release answered 204 for any claim id while READY, where consume with the same id gave 404.
/// Now, in every state, an id that is not the current claim (or the one that last ended on the token) is
/// unknown to both, and the ones they know, they agree on.
pub async fn release_and_consume_agree_on_claim_ids(backend: Backend) {
    let q = queue("claim-ids");
    let secret = TokenSecret::generate().unwrap();
    let m = member("buyer");
    let stranger = digest_of("never-issued");
    let unknown_to_both = |release: ReleaseOutcome, consume: ConsumeOutcome, state: &str| {
        assert_eq!(
            release,
            ReleaseOutcome::Rejected(ReleaseRejection::UnknownClaim),
            "release while {state}"
        );
        assert_eq!(
            consume,
            ConsumeOutcome::Rejected(ConsumeRejection::UnknownClaim),
            "consume while {state}"
        );
    };
    let probe = |state: &'static str| {
        let store = Arc::clone(&backend.queues);
        let (q, m) = (q.clone(), m.clone());
        async move {
            let release = store.release(&q, &m, &stranger).await.unwrap();
            let consume = store.consume(&q, &m, &stranger).await.unwrap();
            unknown_to_both(release, consume, state);
        }
    };
    probe("not entered").await;
    backend.queues.enter(&q, &m).await.unwrap();
    probe("waiting").await;
    backend.queues.admit(&q, tokens(&secret, 1)).await.unwrap();
    probe("ready").await;
    let token = digest_of(&ready_token(&backend, &secret, &q, &m).await);
    let (_, claim) = new_claim_id().unwrap();
    assert!(matches!(
        backend.queues.claim(&q, &m, &token, &claim).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    probe("claimed").await;
    assert_eq!(
        backend.queues.release(&q, &m, &claim).await.unwrap(),
        ReleaseOutcome::Released(ReleasedTo::Ready)
    );
    probe("ready after a release").await;
    assert_eq!(
        backend.queues.release(&q, &m, &claim).await.unwrap(),
        ReleaseOutcome::Released(ReleasedTo::AlreadyReleased),
        "a repeated release of the same claim is a no-op"
    );
    // The released claim is still known: a late consume for it is honoured (one token, one order).
    assert_eq!(
        backend.queues.consume(&q, &m, &claim).await.unwrap(),
        ConsumeOutcome::Consumed
    );
    probe("consumed").await;
    assert_eq!(
        backend.queues.release(&q, &m, &claim).await.unwrap(),
        ReleaseOutcome::Rejected(ReleaseRejection::AlreadyConsumed)
    );
}

/// Defect 4 and issue 30: only queues with somebody waiting are active; an idle queue (created by an admin
/// PUT, or emptied) is not, nor one holding only READY / CLAIMED members, so admission never visits them.
/// Their expiries are deadlines instead: the admission and expiry steps answer the earliest one. The store
/// keeps the set in step with its own transitions.
pub async fn only_busy_queues_are_active(backend: Backend) {
    let secret = TokenSecret::generate().unwrap();
    let idle = queue("active-idle");
    let busy = queue("active-busy");
    let patch = SettingsPatch {
        paused: Some(false),
        ..SettingsPatch::default()
    };
    backend
        .queues
        .update_settings(&idle, &patch)
        .await
        .unwrap()
        .unwrap();
    assert!(!backend.queues.active_queues().await.unwrap().contains(&idle));
    let m = member("m-1");
    backend.queues.enter(&busy, &m).await.unwrap();
    assert_eq!(backend.queues.active_queues().await.unwrap(), vec![busy.clone()]);
    // READY needs no admission tick: its token's expiry is the deadline the step answers.
    let admitted = backend.queues.admit(&busy, tokens(&secret, 5)).await.unwrap();
    assert!(backend.queues.active_queues().await.unwrap().is_empty());
    let view = backend.queues.position(&busy, &m).await.unwrap();
    let (_, token_expires_ms) = view.token.expect("READY with a token");
    assert_eq!(admitted.next_deadline_ms, Some(token_expires_ms));
    let token = digest_of(&ready_token(&backend, &secret, &busy, &m).await);
    let (_, claim) = new_claim_id().unwrap();
    let ClaimOutcome::Claimed { expires_at_ms } =
        backend.queues.claim(&busy, &m, &token, &claim).await.unwrap()
    else {
        panic!("the claim is granted");
    };
    let expiry = backend.queues.expire_due(&busy).await.unwrap();
    assert_eq!(
        expiry.next_deadline_ms,
        Some(expires_at_ms.min(token_expires_ms)),
        "the claim's expiry is a deadline too"
    );
    backend.queues.consume(&busy, &m, &claim).await.unwrap();
    // The next admission step finds it empty and the store takes it out.
    let step = backend.queues.admit(&busy, Vec::new()).await.unwrap();
    assert_eq!((step.waiting, step.outstanding), (0, 0));
    assert!(backend.queues.active_queues().await.unwrap().is_empty());
    let preview = backend.queues.admission_preview(&busy).await.unwrap().unwrap();
    assert_eq!(
        (preview.waiting, preview.outstanding, preview.tokens_needed()),
        (0, 0, 0)
    );
    // A new entry makes it active again.
    backend.queues.enter(&busy, &member("m-2")).await.unwrap();
    assert_eq!(backend.queues.active_queues().await.unwrap(), vec![busy.clone()]);
    let preview = backend.queues.admission_preview(&busy).await.unwrap().unwrap();
    assert_eq!(preview.tokens_needed(), 1, "min(per tick, waiting, room)");
}

/// Defect 4: first entries may create at most `max_queues` queues (the conformance backends use the
/// default, 1,000); the next new queue is refused with `TooManyQueues`, existing queues still take
/// entries, and an admin PUT may still create one. Deleting a queue makes room.
pub async fn first_entries_create_at_most_max_queues(backend: Backend) {
    let m = member("m-1");
    for i in 0..super::DEFAULT_MAX_QUEUES {
        backend
            .queues
            .enter(&queue(&format!("cap-{i:04}")), &m)
            .await
            .unwrap();
    }
    assert_eq!(
        backend.queues.queues().await.unwrap().len(),
        super::DEFAULT_MAX_QUEUES
    );
    let one_too_many = queue("cap-one-too-many");
    match backend.queues.enter(&one_too_many, &m).await {
        Err(super::StoreError::TooManyQueues { max_queues }) => {
            assert_eq!(max_queues, super::DEFAULT_MAX_QUEUES);
        }
        other => panic!("expected TooManyQueues, got {other:?}"),
    }
    assert_eq!(
        backend.queues.settings(&one_too_many).await.unwrap(),
        None,
        "nothing created"
    );
    backend
        .queues
        .enter(&queue("cap-0007"), &member("m-2"))
        .await
        .unwrap();
    backend
        .queues
        .update_settings(&queue("cap-admin"), &SettingsPatch::default())
        .await
        .unwrap()
        .unwrap();
    assert!(backend.queues.delete_queue(&queue("cap-0001")).await.unwrap());
    assert!(backend.queues.delete_queue(&queue("cap-0002")).await.unwrap());
    backend.queues.enter(&one_too_many, &m).await.unwrap();
}

/// SPEC 2.1: an admin deletes a queue with everyone in it; it is gone from every listing and reads as
/// absent, a second delete says it did not exist, and a new entry starts a fresh queue.
pub async fn deleted_queues_are_gone_with_their_members(backend: Backend) {
    let secret = TokenSecret::generate().unwrap();
    let q = queue("to-delete");
    for i in 0..30 {
        backend
            .queues
            .enter(&q, &member(&format!("m-{i}")))
            .await
            .unwrap();
    }
    backend.queues.admit(&q, tokens(&secret, 10)).await.unwrap();
    assert!(backend.queues.delete_queue(&q).await.unwrap());
    assert!(!backend.queues.delete_queue(&q).await.unwrap(), "already gone");
    assert!(!backend.queues.queues().await.unwrap().contains(&q));
    assert!(!backend.queues.active_queues().await.unwrap().contains(&q));
    assert_eq!(backend.queues.settings(&q).await.unwrap(), None);
    assert_eq!(backend.queues.stats(&q).await.unwrap(), None);
    let view = backend.queues.position(&q, &member("m-0")).await.unwrap();
    assert_eq!(view.status, MemberStatus::NotEntered);
    let again = backend.queues.enter(&q, &member("m-20")).await.unwrap();
    assert_eq!((again.view().rank, again.view().waiting_count), (Some(0), 1));
    assert!(backend.queues.queues().await.unwrap().contains(&q));
}

/// Defect 4: an auto-created queue nobody is in is forgotten once idle for the period; a queue an admin
/// configured, or one somebody waits in, is kept.
pub async fn idle_auto_created_queues_are_forgotten(backend: Backend) {
    let auto = queue("forget-auto");
    let managed = queue("forget-managed");
    let waiting = queue("forget-waiting");
    let m = member("m-1");
    backend.queues.enter(&auto, &m).await.unwrap();
    backend.queues.leave(&auto, &m).await.unwrap();
    backend
        .queues
        .update_settings(&managed, &SettingsPatch::default())
        .await
        .unwrap()
        .unwrap();
    backend.queues.enter(&waiting, &m).await.unwrap();
    let hour = 3_600_000;
    assert!(
        !backend.queues.forget_if_idle(&auto, hour).await.unwrap(),
        "not idle long enough"
    );
    backend.clock.advance(hour);
    assert!(backend.queues.forget_if_idle(&auto, hour).await.unwrap());
    assert!(!backend.queues.forget_if_idle(&managed, hour).await.unwrap());
    assert!(!backend.queues.forget_if_idle(&waiting, hour).await.unwrap());
    let listed = backend.queues.queues().await.unwrap();
    assert!(!listed.contains(&auto) && listed.contains(&managed) && listed.contains(&waiting));
    assert_eq!(backend.queues.settings(&auto).await.unwrap(), None);
    assert_eq!(backend.queues.position(&waiting, &m).await.unwrap().rank, Some(0));
}

/// Found by the backend-equivalence test (`tests/queue_equivalence.rs`): the embedded store recorded its
/// monotonic clock guard on every read, Redis only on reads whose answer depends on a token's expiry. After
/// the clock stepped back the two then admitted, issued and expired on different clocks, and a poll of an
/// idle queue kept it alive on one backend only. The rule both follow now: a READY or CLAIMED member's read
/// records the guard (a later claim never runs on an earlier clock than that answer did); a waiting
/// member's position or re-entry, and a read of someone not in the queue, leave it, and are no activity.
pub async fn reads_record_the_clock_guard_only_when_they_read_a_token(backend: Backend) {
    let q = queue("guard");
    let secret = TokenSecret::generate().unwrap();
    let (holder, waiter) = (member("holder"), member("waiter"));
    backend.queues.enter(&q, &holder).await.unwrap();
    backend.queues.enter(&q, &waiter).await.unwrap();
    backend.queues.admit(&q, tokens(&secret, 1)).await.unwrap();
    let start = backend.clock.now_millis();

    backend.clock.set(start + 5_000);
    assert_eq!(
        backend.queues.position(&q, &waiter).await.unwrap().now_ms,
        start + 5_000
    );
    assert!(matches!(
        backend.queues.enter(&q, &waiter).await.unwrap(),
        EnterOutcome::AlreadyPresent(_)
    ));
    backend.clock.set(start);
    assert_eq!(
        backend.queues.position(&q, &waiter).await.unwrap().now_ms,
        start,
        "a waiting member's reads did not move the queue's clock"
    );

    backend.clock.set(start + 5_000);
    let token = ready_token(&backend, &secret, &q, &holder).await;
    backend.clock.set(start);
    let (_, claim) = new_claim_id().unwrap();
    assert_eq!(
        backend
            .queues
            .claim(&q, &holder, &digest_of(&token), &claim)
            .await
            .unwrap(),
        ClaimOutcome::Claimed {
            expires_at_ms: start + 5_000 + QueueSettings::default().claim_ttl_millis()
        },
        "the READY member's read recorded the clock: the claim runs no earlier"
    );

    let idle = queue("guard-idle");
    let m = member("m-1");
    backend.queues.enter(&idle, &m).await.unwrap();
    backend.queues.leave(&idle, &m).await.unwrap();
    let hour = 3_600_000;
    backend.clock.set(start + hour);
    assert_eq!(
        backend.queues.position(&idle, &m).await.unwrap().status,
        MemberStatus::NotEntered
    );
    assert!(
        backend.queues.forget_if_idle(&idle, hour).await.unwrap(),
        "a read of a queue nobody is in is no activity"
    );
}

/// Defect 17: expiring ten thousand due tokens happens in bounded steps, yet one `expire_due` call
/// still expires them all.
pub async fn ten_thousand_due_tokens_expire_in_bounded_steps(backend: Backend) {
    let secret = TokenSecret::generate().unwrap();
    let q = queue("mass-expiry");
    let patch = SettingsPatch {
        admit_per_second: Some(100_000.0),
        token_ttl_seconds: Some(60),
        ..SettingsPatch::default()
    };
    backend.queues.update_settings(&q, &patch).await.unwrap().unwrap();
    for i in 0..10_000 {
        backend
            .queues
            .enter(&q, &member(&format!("m-{i}")))
            .await
            .unwrap();
    }
    let mut admitted = 0;
    for _ in 0..10 {
        // A second's budget is 100,000: each step admits all 1,000 tokens it is offered.
        backend.clock.advance(1_000);
        admitted += backend
            .queues
            .admit(&q, tokens(&secret, 1_000))
            .await
            .unwrap()
            .admitted
            .len();
    }
    assert_eq!(admitted, 10_000);
    backend.clock.advance(60_000);
    let expired = backend.queues.expire_due(&q).await.unwrap();
    assert_eq!(expired.tokens_expired, 10_000);
    assert!(!expired.more_due);
    let stats = backend.queues.stats(&q).await.unwrap().unwrap();
    assert_eq!((stats.ready, stats.waiting), (0, 0));
}

/// SPEC 2.4: a claim neither consumed nor released within `claim_ttl` goes back to READY by itself.
pub async fn abandoned_claims_are_released_after_claim_ttl(backend: Backend) {
    let q = queue("claim-ttl");
    let secret = TokenSecret::generate().unwrap();
    let m = member("abandoner");
    backend.queues.enter(&q, &m).await.unwrap();
    backend.queues.admit(&q, tokens(&secret, 50)).await.unwrap();
    let token = ready_token(&backend, &secret, &q, &m).await;
    let (_, claim) = new_claim_id().unwrap();
    assert!(matches!(
        backend
            .queues
            .claim(&q, &m, &digest_of(&token), &claim)
            .await
            .unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    backend.clock.advance(29_999);
    assert_eq!(backend.queues.expire_due(&q).await.unwrap().claims_expired, 0);
    backend.clock.advance(1);
    assert_eq!(backend.queues.expire_due(&q).await.unwrap().claims_expired, 1);
    assert_eq!(
        backend.queues.position(&q, &m).await.unwrap().status,
        MemberStatus::Ready
    );
    // The order did commit late: its consume is honoured and the token is spent.
    assert_eq!(
        backend.queues.consume(&q, &m, &claim).await.unwrap(),
        ConsumeOutcome::Consumed
    );
}

/// SPEC 2.3: an expired, unused token frees its slot, and `max_active` bounds READY + CLAIMED.
pub async fn expired_tokens_free_their_slot_under_max_active(backend: Backend) {
    let q = queue("max-active");
    let secret = TokenSecret::generate().unwrap();
    for i in 0..10 {
        backend
            .queues
            .enter(&q, &member(&format!("m-{i}")))
            .await
            .unwrap();
    }
    let patch = SettingsPatch {
        max_active: Some(Some(3)),
        token_ttl_seconds: Some(10),
        ..SettingsPatch::default()
    };
    backend.queues.update_settings(&q, &patch).await.unwrap().unwrap();
    let first = backend.queues.admit(&q, tokens(&secret, 50)).await.unwrap();
    assert_eq!(first.admitted.len(), 3);
    backend.clock.advance(5_000);
    assert_eq!(
        backend
            .queues
            .admit(&q, tokens(&secret, 50))
            .await
            .unwrap()
            .admitted
            .len(),
        0,
        "slots are full"
    );
    backend.clock.advance(5_000);
    let after_expiry = backend.queues.admit(&q, tokens(&secret, 50)).await.unwrap();
    assert_eq!(after_expiry.tokens_expired, 3);
    assert_eq!(after_expiry.admitted.len(), 3, "expired tokens freed their slots");
    assert_eq!(after_expiry.outstanding, 3);
    let expired = backend.queues.position(&q, &first.admitted[0]).await.unwrap();
    assert_eq!(expired.status, MemberStatus::NotEntered);
}

/// DELETE leaves the line or gives back a token; it is idempotent.
pub async fn leave_removes_waiting_and_ready_members(backend: Backend) {
    let q = queue("leave");
    let secret = TokenSecret::generate().unwrap();
    let (a, b, c) = (member("a"), member("b"), member("c"));
    for m in [&a, &b, &c] {
        backend.queues.enter(&q, m).await.unwrap();
    }
    backend
        .queues
        .update_settings(
            &q,
            &SettingsPatch {
                max_active: Some(Some(1)),
                ..SettingsPatch::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    backend.queues.admit(&q, tokens(&secret, 50)).await.unwrap();
    assert_eq!(
        backend.queues.leave(&q, &b).await.unwrap(),
        LeaveOutcome::Left(MemberStatus::Waiting)
    );
    assert_eq!(
        backend.queues.position(&q, &c).await.unwrap().rank,
        Some(0),
        "c moved up"
    );
    assert_eq!(
        backend.queues.leave(&q, &b).await.unwrap(),
        LeaveOutcome::NotPresent
    );
    assert_eq!(
        backend.queues.leave(&q, &a).await.unwrap(),
        LeaveOutcome::Left(MemberStatus::Ready)
    );
    backend.clock.advance(1000);
    let outcome = backend.queues.admit(&q, tokens(&secret, 50)).await.unwrap();
    assert_eq!(outcome.admitted, vec![c], "giving back a token freed the slot");
}

/// SPEC 2.1: partial updates keep other fields; invalid values change nothing.
pub async fn settings_update_partially_and_reject_invalid_values(backend: Backend) {
    let q = queue("settings");
    assert_eq!(backend.queues.settings(&q).await.unwrap(), None);
    let invalid = SettingsPatch {
        admit_per_second: Some(0.0),
        ..SettingsPatch::default()
    };
    assert!(backend
        .queues
        .update_settings(&q, &invalid)
        .await
        .unwrap()
        .is_err());
    assert_eq!(
        backend.queues.settings(&q).await.unwrap(),
        None,
        "an invalid PUT creates nothing"
    );
    let patch = SettingsPatch {
        paused: Some(true),
        claim_ttl_seconds: Some(5),
        ..SettingsPatch::default()
    };
    let settings = backend.queues.update_settings(&q, &patch).await.unwrap().unwrap();
    assert!(settings.paused);
    assert_eq!(settings.claim_ttl_seconds, 5);
    assert_eq!(
        settings.token_ttl_seconds,
        QueueSettings::default().token_ttl_seconds
    );
    let bad_ttl = SettingsPatch {
        token_ttl_seconds: Some(0),
        ..SettingsPatch::default()
    };
    assert_eq!(
        backend
            .queues
            .update_settings(&q, &bad_ttl)
            .await
            .unwrap()
            .unwrap_err()
            .field(),
        "tokenTtlSeconds"
    );
    assert_eq!(backend.queues.settings(&q).await.unwrap(), Some(settings));
    assert!(backend.queues.queues().await.unwrap().contains(&q));
}

/// Adaptive admission's settings (issue 12) are kept by every read (settings, stats, preview); switching to
/// adaptive clamps the stored rate into the bounds, and a rate-only patch (the controller's) keeps them.
pub async fn adaptive_settings_round_trip_and_clamp_the_rate(backend: Backend) {
    use rankgate_core::queue::AdmissionMode;
    let q = queue("adaptive");
    let rate = SettingsPatch {
        admit_per_second: Some(50.0),
        ..SettingsPatch::default()
    };
    backend.queues.update_settings(&q, &rate).await.unwrap().unwrap();
    let adaptive = SettingsPatch {
        admission_mode: Some(AdmissionMode::Adaptive),
        min_admit_per_second: Some(2.0),
        max_admit_per_second: Some(20.0),
        target_p95_millis: Some(250),
        max_error_rate: Some(0.05),
        ..SettingsPatch::default()
    };
    let settings = backend
        .queues
        .update_settings(&q, &adaptive)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(settings.adaptive.admission_mode, AdmissionMode::Adaptive);
    assert_eq!(settings.admit_per_second, 20.0, "clamped to maxAdmitPerSecond");
    assert_eq!(
        backend.queues.settings(&q).await.unwrap().as_ref(),
        Some(&settings)
    );
    let controller = SettingsPatch {
        admit_per_second: Some(7.5),
        ..SettingsPatch::default()
    };
    let after = backend
        .queues
        .update_settings(&q, &controller)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.admit_per_second, 7.5);
    assert_eq!(
        after.adaptive, settings.adaptive,
        "a rate patch keeps the adaptive settings"
    );
    backend.queues.enter(&q, &member("m")).await.unwrap();
    let stats = backend.queues.stats(&q).await.unwrap().unwrap();
    assert_eq!(stats.settings, after);
    let preview = backend.queues.admission_preview(&q).await.unwrap().unwrap();
    assert_eq!(preview.settings, after);
    let too_fast = SettingsPatch {
        max_admit_per_second: Some(200_000.0),
        ..SettingsPatch::default()
    };
    assert_eq!(
        backend
            .queues
            .update_settings(&q, &too_fast)
            .await
            .unwrap()
            .unwrap_err()
            .field(),
        "maxAdmitPerSecond"
    );
    assert_eq!(backend.queues.settings(&q).await.unwrap(), Some(after));
}

/// The admin counters: waiting, ready, claimed, admitted in the last minute, oldest wait.
pub async fn stats_report_counts_oldest_wait_and_admissions(backend: Backend) {
    let q = queue("stats");
    let secret = TokenSecret::generate().unwrap();
    for i in 0..100 {
        backend
            .queues
            .enter(&q, &member(&format!("m-{i}")))
            .await
            .unwrap();
    }
    backend.clock.advance(61_000);
    backend.queues.admit(&q, tokens(&secret, 50)).await.unwrap();
    let stats = backend.queues.stats(&q).await.unwrap().unwrap();
    assert_eq!((stats.waiting, stats.ready, stats.claimed), (50, 50, 0));
    assert_eq!(stats.admitted_last_minute, 50);
    assert_eq!(stats.oldest_wait_seconds, 61);
    assert_eq!(backend.queues.stats(&queue("nope")).await.unwrap(), None);
}

/// Limitation 5: estimates come from the measured rate and follow a change of rate.
pub async fn wait_estimate_follows_measured_rate(backend: Backend) {
    let q = queue("estimate");
    let secret = TokenSecret::generate().unwrap();
    for i in 0..3_000 {
        backend
            .queues
            .enter(&q, &member(&format!("m-{i:05}")))
            .await
            .unwrap();
    }
    let probe = member("m-02999");
    backend
        .queues
        .update_settings(
            &q,
            &SettingsPatch {
                admit_per_second: Some(50.0),
                ..SettingsPatch::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    for _ in 0..20 {
        backend.queues.admit(&q, tokens(&secret, 50)).await.unwrap();
        backend.clock.advance(1000);
    }
    let fast = backend.queues.position(&q, &probe).await.unwrap();
    let rank = fast.rank.unwrap();
    let fast_estimate = fast.estimated_wait_seconds.unwrap();
    assert!(
        (rank / 50..=rank / 50 + 2).contains(&fast_estimate),
        "rank {rank}, estimate {fast_estimate}"
    );
    backend
        .queues
        .update_settings(
            &q,
            &SettingsPatch {
                admit_per_second: Some(10.0),
                ..SettingsPatch::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    for _ in 0..40 {
        backend.queues.admit(&q, tokens(&secret, 50)).await.unwrap();
        backend.clock.advance(1000);
    }
    let slow = backend.queues.position(&q, &probe).await.unwrap();
    let rank = slow.rank.unwrap();
    let slow_estimate = slow.estimated_wait_seconds.unwrap();
    // At 10/s the estimate must be close to rank / 10, not rank / 50.
    assert!(
        slow_estimate >= rank / 11 && slow_estimate <= rank / 9 + 2,
        "rank {rank}, estimate {slow_estimate}"
    );
}

/// Issue 12: a queue admitting 20/s told rank 247 to wait 60 s, 2.5 s after a resume, for a true ~12 s.
/// One instance ticking every 100 ms.
pub async fn wait_estimate_is_right_after_opening_and_resuming(backend: Backend) {
    estimates_after_opening_and_resuming(std::slice::from_ref(&backend.queues), &backend.clock).await;
}

/// The estimator's contract after opening and after resuming, with `instances` (store handles sharing
/// one queue) each running a scheduler that ticks every 100 ms, 0, 1, 2… ms apart: within 2.5 s of
/// opening, of a resume after a paused minute the schedulers kept ticking through, and of a resume after
/// a paused minute nobody ticked, the median for rank 247 at 20/s is within a second or so of
/// 248 / 20 = 12.4 s, P90 ≥ median, and both are `None` while paused.
pub async fn estimates_after_opening_and_resuming(instances: &[Arc<dyn QueueStore>], clock: &ManualClock) {
    let q = queue("resumed");
    let secret = TokenSecret::generate().unwrap();
    let first = &instances[0];
    for i in 0..1_200 {
        first.enter(&q, &member(&format!("m-{i:05}"))).await.unwrap();
    }
    let patch = SettingsPatch {
        admit_per_second: Some(20.0),
        tick_millis: Some(100),
        ..SettingsPatch::default()
    };
    first.update_settings(&q, &patch).await.unwrap().unwrap();
    let mut admitted = 0usize;
    // The member now at rank 247 (nobody leaves in this test, so ranks are arrival order minus admitted).
    async fn check(first: &Arc<dyn QueueStore>, q: &QueueName, admitted: usize, when: &str) {
        let view = first
            .position(q, &member(&format!("m-{:05}", admitted + 247)))
            .await
            .unwrap();
        assert_eq!(view.rank, Some(247), "{when}");
        let median = view.estimated_wait_seconds.expect("an estimate while admitting");
        let p90 = view.estimated_wait_p90_seconds.expect("a P90 while admitting");
        assert!(
            (12..=14).contains(&median),
            "{when}: rank 247 at 20/s told {median} s (true ~12.4 s)"
        );
        assert!(
            (median..=median + 8).contains(&p90),
            "{when}: median {median}, P90 {p90}"
        );
    }
    async fn run(
        instances: &[Arc<dyn QueueStore>],
        clock: &ManualClock,
        secret: &TokenSecret,
        q: &QueueName,
        ticks: usize,
    ) -> usize {
        let mut admitted = 0;
        for _ in 0..ticks {
            let start = clock.now_millis();
            for (offset, instance) in instances.iter().enumerate() {
                clock.set(start + offset as i64);
                admitted += instance.admit(q, tokens(secret, 5)).await.unwrap().admitted.len();
            }
            clock.set(start + 100);
        }
        admitted
    }
    check(first, &q, admitted, "just opened (the prior)").await;
    admitted += run(instances, clock, &secret, &q, 25).await;
    check(first, &q, admitted, "2.5 s after opening").await;
    admitted += run(instances, clock, &secret, &q, 75).await;
    check(first, &q, admitted, "10 s after opening").await;

    // Paused for a minute while the schedulers keep visiting the queue.
    let pause = |paused| SettingsPatch {
        paused: Some(paused),
        ..SettingsPatch::default()
    };
    first.update_settings(&q, &pause(true)).await.unwrap().unwrap();
    assert_eq!(
        run(instances, clock, &secret, &q, 600).await,
        0,
        "paused admits nobody"
    );
    let view = first
        .position(&q, &member(&format!("m-{:05}", admitted + 247)))
        .await
        .unwrap();
    assert_eq!(
        (view.estimated_wait_seconds, view.estimated_wait_p90_seconds),
        (None, None),
        "paused: no estimate"
    );
    first.update_settings(&q, &pause(false)).await.unwrap().unwrap();
    admitted += run(instances, clock, &secret, &q, 25).await;
    check(first, &q, admitted, "2.5 s after a resume (ticked while paused)").await;

    // Paused for a minute with no admission step at all (nobody ticked), then resumed.
    first.update_settings(&q, &pause(true)).await.unwrap().unwrap();
    clock.advance(60_000);
    first.update_settings(&q, &pause(false)).await.unwrap().unwrap();
    admitted += run(instances, clock, &secret, &q, 25).await;
    check(
        first,
        &q,
        admitted,
        "2.5 s after a resume (not ticked while paused)",
    )
    .await;
    // ~(2.5 + 7.5 + 2.5 + 2.5) s at 20/s, plus at most a tick's burst per (re)start.
    assert!((290..=320).contains(&admitted), "admitted {admitted}");
}

/// SPEC Part 3: delayed jobs, atomic claims with claim tokens, reaper, backoff, dead set, replay.
pub async fn jobs_claim_ack_retry_reap_and_dead_letter(backend: Backend) {
    let jobs = &backend.jobs;
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        max_delay_ms: 4_000,
        max_attempts: 2,
    };
    let job = |id: &str, delay_ms| NewJob {
        id: id.into(),
        payload: id.as_bytes().to_vec(),
        delay_ms,
        policy,
    };
    assert!(jobs.enqueue("work", job("a", 0)).await.unwrap());
    assert!(
        !jobs.enqueue("work", job("a", 0)).await.unwrap(),
        "enqueue is idempotent by id"
    );
    assert!(jobs.enqueue("work", job("later", 5_000)).await.unwrap());
    let claimed = jobs.claim_due("work", 10, 10_000).await.unwrap();
    assert_eq!(claimed.len(), 1, "the delayed job is not due yet");
    assert_eq!(claimed[0].id, "a");
    assert_eq!(claimed[0].attempt, 1);
    assert!(
        jobs.claim_due("work", 10, 10_000).await.unwrap().is_empty(),
        "a claimed job is invisible"
    );

    // The worker stalls: the reaper takes the job back, and the stale worker's ack is refused.
    backend.clock.advance(10_000);
    assert_eq!(jobs.reap_expired("work").await.unwrap(), 1);
    assert_eq!(
        jobs.ack("work", "a", claimed[0].claim_token).await.unwrap(),
        JobAckOutcome::Stale
    );
    backend.clock.advance(1_000);
    let mut second = jobs.claim_due("work", 10, 10_000).await.unwrap();
    second.sort_by(|x, y| x.id.cmp(&y.id));
    let a = second
        .iter()
        .find(|j| j.id == "a")
        .expect("retried after backoff");
    assert_eq!(a.attempt, 2);
    assert_eq!(
        jobs.nack("work", "a", a.claim_token, "boom").await.unwrap(),
        NackOutcome::Dead
    );
    let dead = jobs.dead_jobs("work", 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, "boom");
    assert_eq!(jobs.replay_dead("work", "a").await.unwrap(), JobAckOutcome::Done);
    let replayed = jobs.claim_due("work", 10, 10_000).await.unwrap();
    let a = replayed
        .iter()
        .find(|j| j.id == "a")
        .expect("replayed job is due now");
    assert_eq!(a.attempt, 1);
    assert_eq!(
        jobs.ack("work", "a", a.claim_token).await.unwrap(),
        JobAckOutcome::Done
    );
    let later = second
        .iter()
        .find(|j| j.id == "later")
        .expect("due after its delay");
    match jobs
        .nack("work", "later", later.claim_token, "retry me")
        .await
        .unwrap()
    {
        NackOutcome::RetryAt(at) => {
            let delay = at - backend.clock.now_millis();
            assert!((500..=1_000).contains(&delay), "backoff with jitter: {delay}");
        }
        other => panic!("expected a retry, got {other:?}"),
    }
    let counts = jobs.counts("work").await.unwrap();
    assert_eq!((counts.ready, counts.processing, counts.dead), (1, 0, 0));
}

/// A failed job asks for a minimum delay (a webhook receiver's `Retry-After`): the retry is not due
/// before it, and a floor beyond the policy's cap is the cap.
pub async fn a_retry_waits_at_least_its_minimum_delay_within_the_cap(backend: Backend) {
    let jobs = &backend.jobs;
    let policy = RetryPolicy {
        base_delay_ms: 100,
        max_delay_ms: 5_000,
        max_attempts: 5,
    };
    let job = |id: &str| NewJob {
        id: id.into(),
        payload: Vec::new(),
        delay_ms: 0,
        policy,
    };
    assert!(jobs.enqueue("floor", job("polite")).await.unwrap());
    assert!(jobs.enqueue("floor", job("greedy")).await.unwrap());
    let claimed = jobs.claim_due("floor", 10, 60_000).await.unwrap();
    assert_eq!(claimed.len(), 2);
    let now = backend.clock.now_millis();
    for claim in &claimed {
        let (min_delay, expected) = if claim.id == "polite" {
            (2_000, 2_000)
        } else {
            (u64::MAX, 5_000)
        };
        assert_eq!(
            jobs.nack_with_min_delay("floor", &claim.id, claim.claim_token, "busy", min_delay)
                .await
                .unwrap(),
            NackOutcome::RetryAt(now + expected),
            "{}",
            claim.id
        );
    }
    backend.clock.advance(1_999);
    assert!(jobs.claim_due("floor", 10, 60_000).await.unwrap().is_empty());
    backend.clock.advance(1);
    let due = jobs.claim_due("floor", 10, 60_000).await.unwrap();
    assert_eq!(due.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["polite"]);
    backend.clock.advance(3_000);
    let due = jobs.claim_due("floor", 10, 60_000).await.unwrap();
    assert_eq!(due.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["greedy"]);
}

/// A paused group (a webhook whose receiver answered 410): its ready jobs are parked at once, a new
/// one is parked on arrival, a claimed one that fails or expires is parked whatever its attempts, and
/// nothing of it is claimed; other groups go on. Resumed, its parked jobs are due at once with fresh
/// attempts.
pub async fn a_paused_group_parks_its_jobs_until_resumed(backend: Backend) {
    let jobs = &backend.jobs;
    let policy = RetryPolicy {
        base_delay_ms: 100,
        max_delay_ms: 1_000,
        max_attempts: 1,
    };
    let job = |id: &str, delay_ms| NewJob {
        id: id.into(),
        payload: id.as_bytes().to_vec(),
        delay_ms,
        policy,
    };
    // gone:1 in flight when the pause comes; gone:2 in flight and its claim will expire.
    for id in ["gone:1", "gone:2"] {
        assert!(jobs.enqueue("hooks", job(id, 0)).await.unwrap());
    }
    for id in ["gone:3", "other:1", "gone-not:1"] {
        assert!(jobs.enqueue("hooks", job(id, 10)).await.unwrap());
    }
    let mut claimed = jobs.claim_due("hooks", 10, 1_000).await.unwrap();
    claimed.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(
        claimed.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["gone:1", "gone:2"]
    );
    assert!(jobs
        .pause_group("hooks", "gone", "the receiver answered 410")
        .await
        .unwrap());
    assert!(
        !jobs.pause_group("hooks", "gone", "again").await.unwrap(),
        "paused already: the first pause is kept"
    );
    let paused = jobs.paused_groups("hooks").await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].group, "gone");
    assert_eq!(paused[0].reason, "the receiver answered 410");
    assert_eq!(paused[0].since_ms, backend.clock.now_millis());
    assert!(jobs.paused_groups("elsewhere").await.unwrap().is_empty());
    // Out of attempts, yet parked rather than dead.
    assert_eq!(
        jobs.nack("hooks", "gone:1", claimed[0].claim_token, "410")
            .await
            .unwrap(),
        NackOutcome::Parked
    );
    assert!(jobs.enqueue("hooks", job("gone:4", 0)).await.unwrap());
    backend.clock.advance(1_000);
    assert_eq!(jobs.reap_expired("hooks").await.unwrap(), 1);
    let others = jobs.claim_due("hooks", 10, 1_000).await.unwrap();
    let mut ids: Vec<&str> = others.iter().map(|j| j.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        ["gone-not:1", "other:1"],
        "only the other groups are claimed"
    );
    for other in &others {
        jobs.ack("hooks", &other.id, other.claim_token).await.unwrap();
    }
    let counts = jobs.counts("hooks").await.unwrap();
    assert_eq!(
        (counts.ready, counts.processing, counts.dead, counts.parked),
        (0, 0, 0, 4),
        "gone:1 (failed), gone:2 (expired), gone:3 (ready), gone:4 (new) parked"
    );
    backend.clock.advance(60_000);
    assert!(
        jobs.claim_due("hooks", 10, 1_000).await.unwrap().is_empty(),
        "parked for good"
    );

    assert!(jobs.resume_group("hooks", "gone").await.unwrap());
    assert!(
        !jobs.resume_group("hooks", "gone").await.unwrap(),
        "not paused any more"
    );
    assert!(jobs.paused_groups("hooks").await.unwrap().is_empty());
    let resumed = jobs.claim_due("hooks", 10, 1_000).await.unwrap();
    let mut ids: Vec<(&str, u32)> = resumed.iter().map(|j| (j.id.as_str(), j.attempt)).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        [("gone:1", 1), ("gone:2", 1), ("gone:3", 1), ("gone:4", 1)],
        "due at once, with fresh attempts"
    );
    assert!(resumed.iter().all(|j| j.payload == j.id.as_bytes()));
    let counts = jobs.counts("hooks").await.unwrap();
    assert_eq!((counts.processing, counts.parked), (4, 0));
}

/// Found by the backend-equivalence test: the embedded job store kept one clock guard for all job queues
/// and did not move it on an ack, where Redis keeps one per job queue and moves it on every step. After
/// the clock stepped back, a job's due time and claim expiry then differed between the backends.
pub async fn each_job_queue_has_its_own_clock_guard_moved_by_every_step(backend: Backend) {
    let jobs = &backend.jobs;
    let policy = RetryPolicy::default();
    let job = |id: &str, delay_ms| NewJob {
        id: id.into(),
        payload: Vec::new(),
        delay_ms,
        policy,
    };
    let start = backend.clock.now_millis();
    backend.clock.set(start + 5_000);
    assert_eq!(
        jobs.ack("guarded", "nobody", 7).await.unwrap(),
        JobAckOutcome::Stale
    );
    backend.clock.set(start);
    assert!(jobs.enqueue("guarded", job("a", 1_000)).await.unwrap());
    backend.clock.set(start + 5_500);
    assert!(
        jobs.claim_due("guarded", 10, 1_000).await.unwrap().is_empty(),
        "due at the ack's time + 1 s, not the stepped-back clock's"
    );
    backend.clock.set(start + 6_000);
    assert_eq!(jobs.claim_due("guarded", 10, 1_000).await.unwrap().len(), 1);
    // Another job queue never saw those later times: it runs on the clock as it is.
    backend.clock.set(start);
    assert!(jobs.enqueue("other", job("b", 0)).await.unwrap());
    let claimed = jobs.claim_due("other", 10, 1_000).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].claim_expires_at_ms, start + 1_000);
}

/// SPEC Part 3: the sliding log allows `limit` per window, caps itself, and recovers after the window.
pub async fn sliding_log_limits_and_caps(backend: Backend) {
    let limit = RateLimit {
        limit: 3,
        window_ms: 1_000,
    };
    let mut allowed = 0;
    for _ in 0..10 {
        if backend
            .limiter
            .try_acquire("poll:m-1", limit, RateLimiterKind::SlidingLog)
            .await
            .unwrap()
            .is_allowed()
        {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 3, "same-millisecond requests each count");
    match backend
        .limiter
        .try_acquire("poll:m-1", limit, RateLimiterKind::SlidingLog)
        .await
        .unwrap()
    {
        RateDecision::Limited { retry_after_ms } => assert_eq!(retry_after_ms, 1_000),
        other => panic!("expected limited, got {other:?}"),
    }
    assert!(
        backend
            .limiter
            .try_acquire("poll:m-2", limit, RateLimiterKind::SlidingLog)
            .await
            .unwrap()
            .is_allowed(),
        "keys are independent"
    );
    // A clock stepping back neither refunds nor breaks the window.
    backend.clock.advance(-5_000);
    assert!(!backend
        .limiter
        .try_acquire("poll:m-1", limit, RateLimiterKind::SlidingLog)
        .await
        .unwrap()
        .is_allowed());
    backend.clock.advance(6_000);
    assert!(backend
        .limiter
        .try_acquire("poll:m-1", limit, RateLimiterKind::SlidingLog)
        .await
        .unwrap()
        .is_allowed());
}

/// SPEC Part 3: the bucketed sliding-window counter holds the limit.
pub async fn sliding_window_counter_limits(backend: Backend) {
    let limit = RateLimit {
        limit: 5,
        window_ms: 1_000,
    };
    let kind = RateLimiterKind::SlidingWindow { buckets: 10 };
    let mut allowed = 0;
    for _ in 0..20 {
        if backend
            .limiter
            .try_acquire("ip:1", limit, kind)
            .await
            .unwrap()
            .is_allowed()
        {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 5);
    backend.clock.advance(2_000);
    assert!(backend
        .limiter
        .try_acquire("ip:1", limit, kind)
        .await
        .unwrap()
        .is_allowed());
}

/// Found by the backend-equivalence test: the embedded limiter kept one monotonic guard per shard of keys,
/// Redis one per key, so after the clock stepped back a key could be decided on a time another key had
/// read. Each key's clock is its own: a thousand other keys (so, on the embedded store, some in this key's
/// shard) reading a later time change nothing for it.
pub async fn each_limiter_key_has_its_own_clock_guard(backend: Backend) {
    let limit = RateLimit {
        limit: 1,
        window_ms: 1_000,
    };
    let kind = RateLimiterKind::SlidingLog;
    let start = backend.clock.now_millis();
    assert!(backend
        .limiter
        .try_acquire("guard:mine", limit, kind)
        .await
        .unwrap()
        .is_allowed());
    backend.clock.set(start + 5_000);
    for i in 0..1_000 {
        backend
            .limiter
            .try_acquire(&format!("guard:other-{i}"), limit, kind)
            .await
            .unwrap();
    }
    backend.clock.set(start + 500);
    assert_eq!(
        backend
            .limiter
            .try_acquire("guard:mine", limit, kind)
            .await
            .unwrap(),
        RateDecision::Limited { retry_after_ms: 500 },
        "decided at this key's time, 500 ms after its last request"
    );
}

fn reports(backend: &Backend) -> &dyn ReportStore {
    backend
        .queues
        .reports()
        .expect("every shipped backend keeps sale reports")
}

/// Issue 28: an admission step answers how long each admitted member waited, from the arrival the store
/// recorded (not the caller's clock), so the report's waits are right whichever instance admitted.
pub async fn admission_answers_each_members_wait_from_its_arrival(backend: Backend) {
    let q = queue("report-waits");
    let secret = TokenSecret::generate().unwrap();
    let (early, same_ms, later) = (member("early"), member("same-ms"), member("later"));
    backend.queues.enter(&q, &early).await.unwrap();
    backend.queues.enter(&q, &same_ms).await.unwrap();
    backend.clock.advance(2_500);
    backend.queues.enter(&q, &later).await.unwrap();
    backend.clock.advance(4_000);
    let outcome = backend.queues.admit(&q, tokens(&secret, 3)).await.unwrap();
    assert_eq!(outcome.admitted, vec![early, same_ms, later]);
    assert_eq!(outcome.waits_ms, vec![Some(6_500), Some(6_500), Some(4_000)]);
    assert_eq!(outcome.abandoned, 0);
}

/// Issue 28: reports are sums of what every writer (instance) added, minute by minute and in total; a
/// queue forgotten when idle keeps its report, and only deleting the report removes it.
pub async fn sale_reports_add_up_across_writers_and_outlive_the_queue(backend: Backend) {
    let q = queue("report-sums");
    let store = reports(&backend);
    assert_eq!(store.read_report(&q).await.unwrap(), None, "nothing added yet");
    let minute = backend.clock.now_millis() / 60_000;
    let mut first = ReportDelta::default();
    first.add(minute, ReportField::Arrivals, 3);
    first.add(minute, ReportField::Refused(RefusalReason::Address), 2);
    first.add(minute, ReportField::Wait(4), 1);
    let mut second = ReportDelta::default();
    second.add(minute, ReportField::Arrivals, 4);
    second.add(minute, ReportField::Wait(4), 2);
    second.add(minute + 1, ReportField::Admitted, 5);
    second.add(minute + 1, ReportField::Orders, 1);
    second.add(minute + 1, ReportField::Estimate(9), 5);
    let (a, b) = (
        store.add_to_report(&q, &first, 1),
        store.add_to_report(&q, &second, 2),
    );
    let (a, b) = tokio::join!(a, b);
    a.unwrap();
    b.unwrap();
    let report = store.read_report(&q).await.unwrap().expect("a report");
    assert_eq!(
        report.minutes.keys().copied().collect::<Vec<_>>(),
        vec![minute, minute + 1]
    );
    let this_minute = &report.minutes[&minute];
    assert_eq!(this_minute.get(ReportField::Arrivals), 7);
    assert_eq!(this_minute.get(ReportField::Refused(RefusalReason::Address)), 2);
    assert_eq!(this_minute.get(ReportField::Wait(4)), 3);
    let next_minute = &report.minutes[&(minute + 1)];
    assert_eq!(next_minute.get(ReportField::Admitted), 5);
    assert_eq!(next_minute.get(ReportField::Estimate(9)), 5);
    assert_eq!(report.totals.get(ReportField::Arrivals), 7);
    assert_eq!(report.totals.get(ReportField::Orders), 1);
    assert_eq!(
        report.totals.get(ReportField::Refused(RefusalReason::Challenge)),
        0
    );

    // The queue itself comes and goes (made by an entry, forgotten idle): the report stays.
    backend.queues.enter(&q, &member("m")).await.unwrap();
    backend.queues.leave(&q, &member("m")).await.unwrap();
    backend.clock.advance(3_600_000);
    assert!(
        backend.queues.forget_if_idle(&q, 60_000).await.unwrap(),
        "forgotten"
    );
    assert_eq!(store.read_report(&q).await.unwrap(), Some(report));
    store.delete_report(&q).await.unwrap();
    assert_eq!(store.read_report(&q).await.unwrap(), None, "deleted");
    assert_eq!(store.read_report_totals(&q).await.unwrap(), None, "deleted");
}

/// Issue 28, bounds: a report keeps the last `REPORT_MINUTES_KEPT` minutes (totals stay whole), and at
/// most `max_reports` reports are kept, the least recently written dropped first.
pub async fn sale_reports_keep_seven_days_and_at_most_max_reports(backend: Backend) {
    let store = reports(&backend);
    let q = queue("report-bounded");
    let start = 29_000_000;
    let mut delta = ReportDelta::default();
    delta.add(start, ReportField::Arrivals, 1);
    delta.add(start + 1, ReportField::Arrivals, 2);
    store.add_to_report(&q, &delta, 10).await.unwrap();
    let mut later = ReportDelta::default();
    later.add(start + REPORT_MINUTES_KEPT, ReportField::Arrivals, 4);
    store.add_to_report(&q, &later, 20).await.unwrap();
    let report = store.read_report(&q).await.unwrap().unwrap();
    assert_eq!(
        report.minutes.keys().copied().collect::<Vec<_>>(),
        vec![start + 1, start + REPORT_MINUTES_KEPT],
        "the minute a full week behind the newest is dropped"
    );
    assert_eq!(
        report.totals.get(ReportField::Arrivals),
        7,
        "totals keep every count"
    );

    let (old, new) = (queue("report-old"), queue("report-new"));
    let mut one = ReportDelta::default();
    one.add(start, ReportField::Orders, 1);
    store.add_to_report(&old, &one, 5).await.unwrap();
    store.add_to_report(&new, &one, 30).await.unwrap();
    assert_eq!(
        store.drop_reports_beyond(3).await.unwrap(),
        Vec::<QueueName>::new()
    );
    assert_eq!(store.drop_reports_beyond(2).await.unwrap(), vec![old.clone()]);
    assert_eq!(store.read_report(&old).await.unwrap(), None);
    assert!(store.read_report(&new).await.unwrap().is_some());
    assert!(store.read_report(&q).await.unwrap().is_some());
}

/// The conformance suite against the embedded backend.
#[cfg(test)]
mod embedded {
    use super::Backend;
    use crate::clock::ManualClock;
    use crate::queue::embedded::{EmbeddedOptions, EmbeddedStore};

    async fn make() -> Backend {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = ManualClock::new(1_700_000_000_000);
        let store = EmbeddedStore::open(
            dir.path(),
            std::sync::Arc::new(clock.clone()),
            EmbeddedOptions::default(),
        )
        .expect("open");
        Backend {
            queues: store.clone(),
            jobs: store.clone(),
            limiter: store,
            clock,
            guard: Box::new(dir),
        }
    }

    crate::queue_conformance_suite!(make);
}
