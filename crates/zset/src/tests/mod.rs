//! Tests that need the crate's insides: unit tests per command, the model-based property test, and scale.

mod commands;
mod model;
mod scale;
