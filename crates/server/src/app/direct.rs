//! The routes the fast path answers itself ([`crate::http::fast_path::DirectRoutes`]): the rank read, a
//! member's position poll and a member's entry, each the product's own handler code, composed here so
//! that the HTTP core knows no product and neither product knows the other.

use std::ops::Range;
use std::sync::Arc;

use crate::http::direct_reply::DirectReply;
use crate::http::fast_path::{range_of, DirectMethod, DirectRequest, DirectRoutes};
use crate::rankings::Rankings;
use crate::waiting_room::identity::Credential;
use crate::waiting_room::{self, WaitingRoom};

use super::AppState;

/// The rank read and the member's poll and entry, answered from the products' state.
pub struct DirectRoutesOfApp {
    rankings: Rankings,
    waiting_room: Arc<WaitingRoom>,
}

impl DirectRoutesOfApp {
    /// The direct routes of `state`'s products.
    pub fn new(state: &AppState) -> DirectRoutesOfApp {
        DirectRoutesOfApp {
            rankings: state.rankings.clone(),
            waiting_room: state.waiting_room.clone(),
        }
    }
}

/// A recognised direct request, as ranges of its path.
pub enum DirectTarget {
    /// `GET /v1/products/{productId}/rank`.
    Rank {
        /// The product id.
        product: Range<usize>,
    },
    /// `GET /v1/queues/{queue}/entries/{memberId}` (a query is ignored, as the route ignores it).
    Poll {
        /// The queue.
        queue: Range<usize>,
        /// The member id.
        member: Range<usize>,
    },
    /// `POST /v1/queues/{queue}/entries` (a query is ignored, as the route ignores it).
    Enter {
        /// The queue.
        queue: Range<usize>,
    },
}

impl DirectRoutes for DirectRoutesOfApp {
    type Target = DirectTarget;

    fn recognise(&self, method: DirectMethod, path: &str) -> Option<DirectTarget> {
        match method {
            DirectMethod::Post => {
                let queue = waiting_room::direct_enter_queue(path)?;
                Some(DirectTarget::Enter {
                    queue: range_of(path, queue),
                })
            }
            DirectMethod::Get => {
                if let Some(product) = Rankings::direct_rank_product(path) {
                    return Some(DirectTarget::Rank {
                        product: range_of(path, product),
                    });
                }
                let (queue, member) = waiting_room::direct_poll_target(path)?;
                Some(DirectTarget::Poll {
                    queue: range_of(path, queue),
                    member: range_of(path, member),
                })
            }
        }
    }

    fn route_template(&self, target: &DirectTarget) -> &'static str {
        match target {
            DirectTarget::Rank { .. } => crate::rankings::routes::RANK_ROUTE,
            DirectTarget::Poll { .. } => waiting_room::POLL_ROUTE,
            DirectTarget::Enter { .. } => waiting_room::ENTER_ROUTE,
        }
    }

    async fn answer(&self, target: DirectTarget, request: DirectRequest<'_>) -> DirectReply {
        let path = request.path;
        match target {
            DirectTarget::Rank { product } => {
                self.rankings
                    .rank_reply(&path[product], request.query, request.if_none_match)
                    .await
            }
            DirectTarget::Poll { queue, member } => {
                let credential = Credential::of_direct(&request.headers, request.peer);
                waiting_room::poll_reply(&self.waiting_room, &path[queue], &path[member], &credential).await
            }
            DirectTarget::Enter { queue } => {
                let credential = Credential::of_direct(&request.headers, request.peer);
                waiting_room::enter_reply(&self.waiting_room, &path[queue], &request.body, &credential).await
            }
        }
    }
}
