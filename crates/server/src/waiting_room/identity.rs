//! Who a request speaks for (SPEC 2.2, "Member identity"; issue 29). A member id alone proves nothing:
//! every call for a member (its position, stream, leave, claim, consume, release) must show that member's
//! credential, else 401 JSON (403 when it proves another member), and sees nothing of that member.
//!
//! `member_auth = "ticket"` (the default and, for now, the only mode) accepts either
//! - the `ticket` the member's entry answered with, as `X-Queue-Ticket` ([`super::ticket`]): API clients
//!   and apps; or
//! - the waiting page's signed `rankgate_visitor` cookie naming that member: browsers, with no
//!   configuration ([`super::page::cookies::VisitorKey`]).
//!
//! The ticket wins when both are sent. An entry without a credential creates a member (`{}`: rankgate
//! picks `v-` + 128 random bits; `{"memberId": …}` only while that id is not held yet).

use axum::http::HeaderMap;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::QueueName;
use rankgate_store::queue::Placement;

use super::page::cookies::{self, VisitorKey};
use super::ticket::{TicketKey, TicketRefusal};
use crate::http::error::{ApiError, ApiResult};
use crate::http::fast_path::DirectHeaders;

/// The request header that carries a ticket.
pub const TICKET_HEADER: &str = "x-queue-ticket";

/// What a request shows to prove which member it speaks for, as sent (checked by [`Identity::authorize`]).
/// The visitor cookies are read only when no ticket came: a poll with a ticket never parses cookies.
#[derive(Clone, Copy)]
pub struct Credential<'a> {
    /// `X-Queue-Ticket`, if sent.
    ticket: Option<&'a [u8]>,
    /// Where the `Cookie` headers are.
    headers: DirectHeaders<'a>,
}

impl<'a> Credential<'a> {
    /// The credential of a request hyper read.
    #[must_use]
    pub fn of_headers(headers: &'a HeaderMap) -> Credential<'a> {
        Credential::of_direct(&DirectHeaders::Map(headers))
    }

    /// The credential of a request the fast path (or hyper) read.
    #[must_use]
    pub fn of_direct(headers: &DirectHeaders<'a>) -> Credential<'a> {
        Credential {
            ticket: headers.get_bytes(TICKET_HEADER),
            headers: *headers,
        }
    }

    /// The values of the `rankgate_visitor` cookies sent (unverified).
    fn visitor_cookies(&self) -> Vec<&'a str> {
        cookies::values_in(self.headers.get_all_str("cookie"), cookies::VISITOR_COOKIE)
    }

    /// The place the request's ticket names (see [`super::ticket`]): meaningful only once
    /// [`Identity::authorize`] accepted the credential; `None` without a ticket.
    #[must_use]
    pub fn claimed_placement(&self) -> Option<Placement> {
        self.ticket.and_then(TicketKey::placement)
    }

    /// Whether the request showed anything at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ticket.is_none() && self.visitor_cookies().is_empty()
    }
}

/// The keys that check credentials, derived once from the token secret.
#[derive(Debug, Clone)]
pub struct Identity {
    tickets: TicketKey,
    visitors: VisitorKey,
}

impl Identity {
    /// The identity keys of a room whose token secret gave these keys.
    #[must_use]
    pub fn new(tickets: TicketKey, visitors: VisitorKey) -> Identity {
        Identity { tickets, visitors }
    }

    /// The key of the waiting page's visitor cookies.
    #[must_use]
    pub fn visitor_key(&self) -> &VisitorKey {
        &self.visitors
    }

    /// The ticket of `member` in `queue` at `placement`, for an entry's answer.
    #[must_use]
    pub fn ticket_for(&self, queue: &QueueName, member: &MemberId, placement: Option<Placement>) -> String {
        self.tickets.issue(queue, member, placement)
    }

    /// Whether `ticket` is `member`'s in `queue` (the waiting page's ticket cookie).
    #[must_use]
    pub fn ticket_proves(&self, queue: &QueueName, member: &MemberId, ticket: &str) -> bool {
        self.tickets
            .check(ticket.as_bytes(), queue.as_str(), member.as_str())
            .is_ok()
    }

    /// Ok when `credential` proves `member` of `queue`; 401 when it proves nobody, 403 when it proves
    /// another member.
    pub fn authorize(
        &self,
        queue: &QueueName,
        member: &MemberId,
        credential: &Credential<'_>,
    ) -> ApiResult<()> {
        if let Some(ticket) = credential.ticket {
            return match self.tickets.check(ticket, queue.as_str(), member.as_str()) {
                Ok(()) => Ok(()),
                Err(TicketRefusal::OtherMember) => Err(ApiError::Forbidden(format!(
                    "X-Queue-Ticket: the ticket is another member's (or another queue's), not {member}'s in {queue}"
                ))),
                Err(TicketRefusal::Invalid) => Err(ApiError::Unauthorized(
                    "X-Queue-Ticket: not a ticket this waiting room issued (tampered with, cut short or from \
                     another deployment); send the ticket the entry answered with"
                        .into(),
                )),
            };
        }
        let cookies = credential.visitor_cookies();
        let mut visitors = cookies
            .iter()
            .filter_map(|value| self.visitors.verify(value))
            .peekable();
        if visitors.peek().is_none() {
            return Err(ApiError::Unauthorized(
                "X-Queue-Ticket: missing; every call for a member needs the ticket its entry answered with \
                 (browsers on the waiting page send its visitor cookie instead)"
                    .into(),
            ));
        }
        if visitors.any(|visitor| &visitor == member) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "rankgate_visitor: this browser's visitor cookie names another member than {member}"
            )))
        }
    }
}
