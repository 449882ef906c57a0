//! Who a request speaks for (SPEC 2.2, "Member identity"; issue 29). A member id alone proves nothing:
//! every call for a member (its position, stream, leave, claim, consume, release) must show that member's
//! credential, else 401 JSON (403 when it proves another member), and sees nothing of that member.
//!
//! In every mode a request proves its member with
//! - the `ticket` the member's entry answered with, as `X-Queue-Ticket` ([`super::ticket`]): API clients
//!   and apps; or
//! - the waiting page's signed `rankgate_visitor` cookie naming that member: browsers, with no
//!   configuration ([`super::page::cookies::VisitorKey`]).
//!
//! The ticket wins when both are sent. `[waiting_room] member_auth` ([`MemberAuth`]) adds the shop's own
//! word, checked first:
//! - `"ticket"` (default): nothing more. An entry without a credential creates a member (`{}`: rankgate
//!   picks `v-` + 128 random bits; `{"memberId": …}` only while that id is not held yet). The poll's hot
//!   path in this mode reads the ticket and nothing else (no `Authorization` parsing).
//! - `"gateway"`: a request from a `trusted_proxies` peer, or carrying `Authorization: Bearer <gateway
//!   key>`, is believed about any member id; a bearer that is not a gateway key gets 401 whatever else
//!   came. An entry's `memberId` needs this (or the member's ticket); `{}` still gets an id rankgate
//!   picks, nobody else's, as the waiting page does for a browser without `X-Member-Id`.
//! - `"jwt"`: `Authorization: Bearer <JWT>` proves the JWT's `sub` (403 for another member's id, 401 for
//!   a JWT that does not verify, see [`super::jwt`]); an entry's member is `sub`, and `{}` enters `sub`.

use std::net::IpAddr;

use axum::http::HeaderMap;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::QueueName;
use rankgate_store::queue::Placement;

use super::jwt::JwtVerifier;
use super::member_auth::{GatewayAuth, MemberAuth};
use super::page::cookies::{self, VisitorKey};
use super::ticket::{TicketKey, TicketRefusal};
use crate::http::auth::bearer_credential;
use crate::http::error::{ApiError, ApiResult};
use crate::http::fast_path::DirectHeaders;
use crate::http::peer::PeerAddress;

/// The request header that carries a ticket.
pub const TICKET_HEADER: &str = "x-queue-ticket";

/// What a request shows to prove which member it speaks for, as sent (checked by [`Identity::authorize`]).
/// The visitor cookies are read only when no ticket came, and `Authorization` only in the gateway and
/// jwt modes: a poll with a ticket in ticket mode parses nothing else.
#[derive(Clone, Copy)]
pub struct Credential<'a> {
    /// `X-Queue-Ticket`, if sent.
    ticket: Option<&'a [u8]>,
    /// Where the `Cookie` and `Authorization` headers are.
    headers: DirectHeaders<'a>,
    /// The TCP peer, when known: a `trusted_proxies` peer vouches for the member in gateway mode.
    peer: Option<IpAddr>,
}

impl<'a> Credential<'a> {
    /// The credential of a request hyper read, from `peer`.
    #[must_use]
    pub fn of_request(headers: &'a HeaderMap, peer: PeerAddress) -> Credential<'a> {
        Credential::of_direct(&DirectHeaders::Map(headers), peer.0)
    }

    /// The credential of a request the fast path (or hyper) read, from `peer`.
    #[must_use]
    pub fn of_direct(headers: &DirectHeaders<'a>, peer: Option<IpAddr>) -> Credential<'a> {
        Credential {
            ticket: headers.get_bytes(TICKET_HEADER),
            headers: *headers,
            peer,
        }
    }

    /// The values of the `rankgate_visitor` cookies sent (unverified).
    fn visitor_cookies(&self) -> Vec<&'a str> {
        cookies::values_in(self.headers.get_all_str("cookie"), cookies::VISITOR_COOKIE)
    }

    /// The `Authorization: Bearer` credential, if sent (unverified; never logged or echoed).
    fn bearer(&self) -> Option<&'a str> {
        bearer_credential(self.headers.get_bytes("authorization")?)
    }

    /// The place the request's ticket names (see [`super::ticket`]): meaningful only once
    /// [`Identity::authorize`] accepted the credential; `None` without a ticket.
    #[must_use]
    pub fn claimed_placement(&self) -> Option<Placement> {
        self.ticket.and_then(TicketKey::placement)
    }

    /// The request's headers (for the entry guards' `X-Queue-Challenge`, `Forwarded`, …).
    #[must_use]
    pub fn headers(&self) -> &DirectHeaders<'a> {
        &self.headers
    }

    /// The TCP peer, when known.
    #[must_use]
    pub fn peer(&self) -> Option<IpAddr> {
        self.peer
    }

    /// Whether the request showed a ticket or a visitor cookie.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ticket.is_none() && self.visitor_cookies().is_empty()
    }
}

/// The member an entry enters, whether the request proved it, and the place its ticket claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entrant {
    /// The member.
    pub member: MemberId,
    /// How far the request proved it.
    pub proof: EntryProof,
    /// The place named by a ticket that proves this member (never by a ticket only sent along: in the
    /// gateway and jwt modes the mode's credential may prove the member while the ticket is another's).
    pub claimed: Option<Placement>,
    /// Whether the entry would make a new member, as far as the request shows (the entry guards ask
    /// only new members for anything).
    pub standing: Standing,
}

/// Whether an entry would make a new member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// New: an id rankgate picked, or one named without a credential.
    New,
    /// A member's own re-entry: its ticket proves it was entered before.
    Returning,
    /// Proven by a visitor cookie, the gateway's word or the shop's JWT, which say who the member is but
    /// not whether it is in this queue: the store knows.
    Unknown,
}

/// Whether an entry's request proved its member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryProof {
    /// Proven by the credential (or picked by rankgate, so nobody else's): answered whatever its state.
    Proven,
    /// Named by the body with no credential (ticket mode): entered only while nobody holds the id.
    Claimed,
}

impl Entrant {
    /// A member rankgate picked: nobody else's, and no ticket's place to claim.
    fn picked(member: MemberId) -> Entrant {
        Entrant {
            member,
            proof: EntryProof::Proven,
            claimed: None,
            standing: Standing::New,
        }
    }
}

/// The keys that check credentials, derived once from the token secret, and the room's
/// `member_auth` mode.
#[derive(Debug, Clone)]
pub struct Identity {
    tickets: TicketKey,
    visitors: VisitorKey,
    mode: MemberAuth,
}

impl Identity {
    /// The identity keys of a room whose token secret gave these keys, in `mode`.
    #[must_use]
    pub fn new(tickets: TicketKey, visitors: VisitorKey, mode: MemberAuth) -> Identity {
        Identity {
            tickets,
            visitors,
            mode,
        }
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

    /// The place `ticket` claims for `member` in `queue`: `None` unless the ticket is that member's (an
    /// entry proven by other means, the waiting page's ticket cookie) and names a place.
    #[must_use]
    pub fn place_claimed_by(&self, queue: &QueueName, member: &MemberId, ticket: &[u8]) -> Option<Placement> {
        self.tickets
            .check(ticket, queue.as_str(), member.as_str())
            .ok()
            .and_then(|()| TicketKey::placement(ticket))
    }

    /// Whether `ticket` is `member`'s in `queue`.
    #[must_use]
    pub fn ticket_proves(&self, queue: &QueueName, member: &MemberId, ticket: &[u8]) -> bool {
        self.tickets
            .check(ticket, queue.as_str(), member.as_str())
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
        match &self.mode {
            MemberAuth::Ticket => self.authorize_by_ticket(queue, member, credential),
            MemberAuth::Gateway(gateway) => match gateway_word(gateway, credential)? {
                Some(()) => Ok(()),
                None => self.authorize_by_ticket_or(queue, member, credential, GATEWAY_MISSING),
            },
            MemberAuth::Jwt(verifier) => match jwt_subject(verifier, credential)? {
                Some(subject) if &subject == member => Ok(()),
                Some(_) => Err(ApiError::Forbidden(format!(
                    "Authorization: the JWT's sub is another member, not {member}"
                ))),
                None => self.authorize_by_ticket_or(queue, member, credential, JWT_MISSING),
            },
        }
    }

    /// The member an entry enters: `requested` is the body's `memberId` (`None` for `{}`). Errors as
    /// [`Identity::authorize`]'s; see the module docs for each mode.
    pub fn entrant(
        &self,
        queue: &QueueName,
        requested: Option<MemberId>,
        credential: &Credential<'_>,
    ) -> ApiResult<Entrant> {
        let member = match (&self.mode, requested) {
            // An id rankgate picks is new: whatever credential came along (a browser's visitor cookie)
            // is not asked to prove it, nor can a ticket sent along give it a place.
            (MemberAuth::Ticket | MemberAuth::Gateway(_), None) => {
                return Ok(Entrant::picked(super::page::cookies::new_visitor_id()));
            }
            (MemberAuth::Ticket, Some(member)) if credential.is_empty() => {
                return Ok(Entrant {
                    member,
                    proof: EntryProof::Claimed,
                    claimed: None,
                    standing: Standing::New,
                });
            }
            (MemberAuth::Jwt(verifier), None) => match jwt_subject(verifier, credential)? {
                Some(subject) => subject,
                None => {
                    return Err(ApiError::Unauthorized(format!(
                        "{JWT_MISSING} (an entry without memberId enters the JWT's sub)"
                    )))
                }
            },
            (_, Some(member)) => {
                self.authorize(queue, &member, credential)?;
                member
            }
        };
        let (claimed, standing) = match (&self.mode, credential.ticket) {
            (_, None) => (None, Standing::Unknown),
            // In ticket mode a ticket that came was the proof `authorize` checked: no second check.
            (MemberAuth::Ticket, Some(ticket)) => (TicketKey::placement(ticket), Standing::Returning),
            (_, Some(ticket)) => match self.tickets.check(ticket, queue.as_str(), member.as_str()) {
                Ok(()) => (TicketKey::placement(ticket), Standing::Returning),
                Err(_) => (None, Standing::Unknown),
            },
        };
        Ok(Entrant {
            member,
            proof: EntryProof::Proven,
            claimed,
            standing,
        })
    }

    /// The ticket (or visitor cookie) check, the only one of ticket mode; `missing` is the 401's message
    /// when the request showed neither.
    fn authorize_by_ticket_or(
        &self,
        queue: &QueueName,
        member: &MemberId,
        credential: &Credential<'_>,
        missing: &str,
    ) -> ApiResult<()> {
        if credential.is_empty() {
            return Err(ApiError::Unauthorized(missing.to_owned()));
        }
        self.authorize_by_ticket(queue, member, credential)
    }

    fn authorize_by_ticket(
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

/// Gateway mode's 401 when the request showed nothing.
const GATEWAY_MISSING: &str =
    "Authorization: missing; in this waiting room (member_auth \"gateway\") a member \
id is believed only with `Authorization: Bearer <gateway key>`, from a trusted proxy, or with the member's \
X-Queue-Ticket";

/// Jwt mode's 401 when the request showed nothing.
const JWT_MISSING: &str = "Authorization: missing; in this waiting room (member_auth \"jwt\") send \
`Authorization: Bearer <JWT>` signed by the shop, whose sub is the member (or the member's X-Queue-Ticket)";

/// `Some(())` when the shop's gateway vouches for the request (a trusted peer, or a gateway key);
/// `None` when it showed no bearer; 401 for a bearer that is not a gateway key.
fn gateway_word(gateway: &GatewayAuth, credential: &Credential<'_>) -> ApiResult<Option<()>> {
    if credential.peer.is_some_and(|peer| gateway.trusts(peer)) {
        return Ok(Some(()));
    }
    match credential.bearer() {
        None => Ok(None),
        Some(key) if gateway.accepts_key(key) => Ok(Some(())),
        Some(_) => Err(ApiError::Unauthorized(
            "Authorization: not a gateway key of this waiting room; send `Authorization: Bearer <gateway \
             key>` (waiting_room.gateway_keys)"
                .into(),
        )),
    }
}

/// The member a JWT in `Authorization` proves; `None` when no bearer came; 401 for one that does not
/// verify or whose `sub` is no member id.
fn jwt_subject(verifier: &JwtVerifier, credential: &Credential<'_>) -> ApiResult<Option<MemberId>> {
    let Some(token) = credential.bearer() else {
        return Ok(None);
    };
    let subject = verifier
        .verify(token)
        .map_err(|refusal| ApiError::Unauthorized(refusal.message().into()))?;
    MemberId::parse(&subject).map(Some).map_err(|_| {
        ApiError::Unauthorized(
            "Authorization: the JWT's sub is not a member id (1 to 128 bytes, no control characters)".into(),
        )
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::http::HeaderValue;
    use rankgate_store::queue::token::TokenSecret;

    use super::*;
    use crate::waiting_room::jwt::JwtFile;

    const SHOP_SECRET: &str = "a-shop-secret-that-is-32-bytes-long!";

    fn identity(mode: MemberAuth) -> Identity {
        let secret = TokenSecret::from_bytes([7; 32]);
        Identity::new(
            TicketKey::derived_from(&secret),
            VisitorKey::derived_from(&secret),
            mode,
        )
    }

    fn jwt_mode() -> MemberAuth {
        let file = JwtFile {
            algorithms: vec!["HS256".into()],
            secret: Some(SHOP_SECRET.into()),
            ..JwtFile::default()
        };
        MemberAuth::Jwt(Arc::new(JwtVerifier::load(&file).unwrap()))
    }

    fn jwt_of(sub: &str) -> String {
        let exp = jiff::Timestamp::now().as_second() + 60;
        jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &serde_json::json!({ "sub": sub, "exp": exp }),
            &jsonwebtoken::EncodingKey::from_secret(SHOP_SECRET.as_bytes()),
        )
        .unwrap()
    }

    fn id(text: &str) -> MemberId {
        MemberId::parse(text).unwrap()
    }

    /// Found merging the tickets that name a place: with the JWT proving the member, a ticket sent along
    /// was never checked, so another member's ticket (of a lost epoch) could have claimed that member's
    /// place. Only a ticket that proves the entering member names the place claimed.
    #[test]
    fn an_entry_claims_only_the_place_of_a_ticket_that_proves_its_member() {
        let room = identity(jwt_mode());
        let queue = QueueName::parse("sale").unwrap();
        let place = Placement { epoch: 5, place: 1 };
        let mut headers = HeaderMap::new();
        let bearer = HeaderValue::try_from(format!("Bearer {}", jwt_of("attacker"))).unwrap();
        headers.insert("authorization", bearer);
        let victims = room.ticket_for(&queue, &id("victim"), Some(place));
        headers.insert(TICKET_HEADER, HeaderValue::try_from(victims).unwrap());
        let entrant = room
            .entrant(&queue, None, &Credential::of_request(&headers, PeerAddress(None)))
            .unwrap();
        assert_eq!((entrant.member.as_str(), entrant.claimed), ("attacker", None));

        let own = room.ticket_for(&queue, &id("attacker"), Some(place));
        headers.insert(TICKET_HEADER, HeaderValue::try_from(own).unwrap());
        let entrant = room
            .entrant(&queue, None, &Credential::of_request(&headers, PeerAddress(None)))
            .unwrap();
        assert_eq!(entrant.claimed, Some(place));

        // `{}` in ticket mode picks a new id: a ticket sent along claims nothing for it.
        let room = identity(MemberAuth::Ticket);
        let entrant = room
            .entrant(&queue, None, &Credential::of_request(&headers, PeerAddress(None)))
            .unwrap();
        assert!(entrant.member.as_str().starts_with("v-"));
        assert_eq!(entrant.claimed, None);
    }
}
