//! How the waiting room's store outcomes become HTTP answers: one mapping, so every route, the gate and
//! the fast path answer a store that is down, corrupt or full the same way.

use rankgate_store::queue::StoreError;

use crate::http::error::ApiError;

pub(crate) fn store_error(error: StoreError) -> ApiError {
    match error {
        StoreError::Unavailable(message) => {
            tracing::warn!(error = %message, "queue store unavailable; failing closed");
            ApiError::Unavailable("the waiting room is unavailable; try again shortly".into())
        }
        StoreError::Corrupt(message) => ApiError::Internal(anyhow::anyhow!(message)),
        StoreError::TooManyQueues { max_queues } => ApiError::TooManyRequests {
            message: format!(
                "max_queues: this waiting room already has {max_queues} queues, the most an entry may \
                 create; enter an existing queue, or ask an admin to configure this one (PUT \
                 /v1/admin/queues/{{queue}}) or delete an unused one"
            ),
            retry_after_secs: 60,
            headers: Vec::new(),
        },
    }
}
