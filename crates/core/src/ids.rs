//! Identifier newtypes that parse raw strings at the edge of the system.
//!
//! A raw `&str` from a request body, a URL path or a config file becomes an [`EventId`], [`ProductId`],
//! [`Category`] or [`MemberId`] exactly once, through `parse`; after that the type itself is the proof that
//! the rules of SPEC 1.1 and 2.1 hold (byte lengths, no control characters, `all` reserved). The fields are
//! private so no other code can build an unchecked value.
//!
//! Every identifier orders by its bytes (SPEC 1.4 breaks ranking ties by `product_id` bytes ascending), and
//! serializes as a plain JSON string.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a raw string is not a valid identifier. Messages are lowercase and name no field: the caller knows
/// which field it was parsing and prefixes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Empty, or longer than `max` bytes (UTF-8 bytes, not characters).
    #[error("must be 1 to {max} bytes")]
    Length {
        /// The largest allowed length in bytes.
        max: usize,
    },
    /// Contains a character for which [`char::is_control`] holds (C0, DEL or C1).
    #[error("must not contain control characters")]
    ControlCharacter,
    /// The category `all` names the ranking of every product, so no real category may use it.
    #[error("`all` is reserved")]
    Reserved,
}

fn check_length(s: &str, max: usize) -> Result<(), IdError> {
    if s.is_empty() || s.len() > max {
        return Err(IdError::Length { max });
    }
    Ok(())
}

fn check_no_control_characters(s: &str) -> Result<(), IdError> {
    // Printable ASCII (almost every id) holds no control character; only other text is decoded.
    if s.bytes().all(|byte| (0x20..0x7f).contains(&byte)) {
        return Ok(());
    }
    if s.chars().any(char::is_control) {
        return Err(IdError::ControlCharacter);
    }
    Ok(())
}

/// Implements the traits every identifier shares: `as_str`, `Display`, `Debug`, `AsRef<str>`,
/// `Borrow<str>` (so maps keyed by the id can be looked up with a `&str`), and serde as a plain string
/// (deserializing goes through `parse`, so a stored value is re-checked on the way in).
macro_rules! impl_identifier {
    ($name:ident) => {
        impl $name {
            /// The identifier as it was parsed.
            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let raw = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                $name::parse(&raw).map_err(serde::de::Error::custom)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;

            fn from_str(s: &str) -> Result<Self, IdError> {
                $name::parse(s)
            }
        }
    };
}

/// An event's unique id (SPEC 1.1): 1–128 bytes, no control characters. Counted once, ever; a repeat is
/// a duplicate.
///
/// Control characters (C0, DEL, C1) are refused: a NUL cannot be stored in PostgreSQL `text`, and stores
/// written before SPEC 1.1 said so joined ids with newlines (see `rankgate_store::ranking::packed`).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(Box<str>);

impl EventId {
    /// The longest event id, in bytes.
    pub const MAX_BYTES: usize = 128;

    /// Parses an event id: 1 to 128 bytes, no control characters.
    pub fn parse(s: &str) -> Result<EventId, IdError> {
        check_length(s, Self::MAX_BYTES)?;
        check_no_control_characters(s)?;
        Ok(EventId(s.into()))
    }
}

impl_identifier!(EventId);

/// A product's id (SPEC 1.1): 1–128 bytes, no control characters. Orders by bytes, which is the ranking
/// tie-break (SPEC 1.4).
///
/// Held in an `Arc<str>` because one product id is cloned into every hour, period and ranking it shows up
/// in; a clone is a reference-count bump, not an allocation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProductId(Arc<str>);

impl ProductId {
    /// The longest product id, in bytes.
    pub const MAX_BYTES: usize = 128;

    /// Parses a product id: 1 to 128 bytes, no control characters.
    pub fn parse(s: &str) -> Result<ProductId, IdError> {
        check_length(s, Self::MAX_BYTES)?;
        check_no_control_characters(s)?;
        Ok(ProductId(s.into()))
    }
}

impl_identifier!(ProductId);

/// A category id (SPEC 1.1): 1–64 bytes, no control characters, and never `all`.
///
/// `all` is the pseudo-category of every product on the read path; see [`CategoryOrAll`]. The check is
/// exact and case-sensitive: `All` is an ordinary category, since `/v1/categories/All/top` cannot be
/// confused with `/v1/categories/all/top`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Category(Box<str>);

impl Category {
    /// The longest category id, in bytes.
    pub const MAX_BYTES: usize = 64;

    /// Parses a category id: 1 to 64 bytes, no control characters, not `all`.
    pub fn parse(s: &str) -> Result<Category, IdError> {
        check_length(s, Self::MAX_BYTES)?;
        check_no_control_characters(s)?;
        if s == CategoryOrAll::ALL {
            return Err(IdError::Reserved);
        }
        Ok(Category(s.into()))
    }
}

impl_identifier!(Category);

/// A waiting-room member's id (SPEC 2.1): 1–128 bytes, no control characters.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberId(Box<str>);

impl MemberId {
    /// The longest member id, in bytes.
    pub const MAX_BYTES: usize = 128;

    /// Parses a member id: 1 to 128 bytes, no control characters.
    pub fn parse(s: &str) -> Result<MemberId, IdError> {
        check_length(s, Self::MAX_BYTES)?;
        check_no_control_characters(s)?;
        Ok(MemberId(s.into()))
    }
}

impl_identifier!(MemberId);

/// The category part of a ranking's identity (SPEC 1.4): a real category, or `all` for every product.
///
/// Only read paths and ranking keys use this; events carry plain [`Category`] values, which can never be
/// `all`. Orders `All` before every category.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CategoryOrAll {
    /// Every product, whatever its categories.
    All,
    /// Only products that list this category.
    Category(Category),
}

impl CategoryOrAll {
    /// The reserved name of the every-product ranking.
    pub const ALL: &'static str = "all";

    /// Parses `all`, or anything else as a [`Category`].
    pub fn parse(s: &str) -> Result<CategoryOrAll, IdError> {
        if s == Self::ALL {
            return Ok(CategoryOrAll::All);
        }
        Category::parse(s).map(CategoryOrAll::Category)
    }

    /// `all`, or the category id.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            CategoryOrAll::All => Self::ALL,
            CategoryOrAll::Category(category) => category.as_str(),
        }
    }

    /// True for [`CategoryOrAll::All`].
    #[must_use]
    pub fn is_all(&self) -> bool {
        matches!(self, CategoryOrAll::All)
    }
}

impl From<Category> for CategoryOrAll {
    fn from(category: Category) -> Self {
        CategoryOrAll::Category(category)
    }
}

impl fmt::Display for CategoryOrAll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CategoryOrAll {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, IdError> {
        CategoryOrAll::parse(s)
    }
}

impl Serialize for CategoryOrAll {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CategoryOrAll {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        CategoryOrAll::parse(&raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_id_is_1_to_128_bytes() {
        assert!(EventId::parse("e-1").is_ok());
        assert!(EventId::parse(&"x".repeat(128)).is_ok());
        assert_eq!(EventId::parse(""), Err(IdError::Length { max: 128 }));
        assert_eq!(
            EventId::parse(&"x".repeat(129)),
            Err(IdError::Length { max: 128 })
        );
        // Bytes, not characters: 43 three-byte characters are 129 bytes.
        assert!(EventId::parse(&"€".repeat(42)).is_ok());
        assert!(EventId::parse(&"€".repeat(43)).is_err());
    }

    #[test]
    fn event_id_with_newline_or_other_control_character_is_refused() {
        for hostile in [
            "a\nb",
            "x\n",
            "\r",
            "nul\0",
            "tab\t",
            "del\u{7f}",
            "c1\u{85}",
            "c1\u{9f}",
        ] {
            assert_eq!(
                EventId::parse(hostile),
                Err(IdError::ControlCharacter),
                "{hostile:?}"
            );
        }
        // The edges of the two ranges stay allowed: space, and the first character after C1.
        assert!(EventId::parse("a b").is_ok());
        assert!(EventId::parse("\u{a0}").is_ok());
    }

    #[test]
    fn product_id_rejects_control_characters_and_bad_lengths() {
        assert_eq!(ProductId::parse("p-1").unwrap().as_str(), "p-1");
        assert_eq!(ProductId::parse("p\n1"), Err(IdError::ControlCharacter));
        assert_eq!(ProductId::parse("p\u{7f}"), Err(IdError::ControlCharacter));
        assert_eq!(ProductId::parse("p\u{85}"), Err(IdError::ControlCharacter));
        assert_eq!(ProductId::parse(""), Err(IdError::Length { max: 128 }));
        assert_eq!(
            ProductId::parse(&"p".repeat(129)),
            Err(IdError::Length { max: 128 })
        );
        assert!(ProductId::parse("produit à 20 €").is_ok());
    }

    #[test]
    fn category_reserves_all_and_is_1_to_64_bytes() {
        assert_eq!(Category::parse("all"), Err(IdError::Reserved));
        assert!(Category::parse("All").is_ok());
        assert!(Category::parse("toys").is_ok());
        assert!(Category::parse(&"c".repeat(64)).is_ok());
        assert_eq!(Category::parse(&"c".repeat(65)), Err(IdError::Length { max: 64 }));
        assert_eq!(Category::parse(""), Err(IdError::Length { max: 64 }));
        assert_eq!(Category::parse("to\tys"), Err(IdError::ControlCharacter));
    }

    #[test]
    fn member_id_rules() {
        assert!(MemberId::parse("m-1").is_ok());
        assert_eq!(MemberId::parse("m\u{0}"), Err(IdError::ControlCharacter));
        assert_eq!(
            MemberId::parse(&"m".repeat(129)),
            Err(IdError::Length { max: 128 })
        );
    }

    #[test]
    fn category_or_all_parses_the_reserved_name() {
        assert_eq!(CategoryOrAll::parse("all"), Ok(CategoryOrAll::All));
        let toys = CategoryOrAll::parse("toys").unwrap();
        assert_eq!(toys, CategoryOrAll::Category(Category::parse("toys").unwrap()));
        assert_eq!(toys.to_string(), "toys");
        assert_eq!(CategoryOrAll::All.to_string(), "all");
        assert!(CategoryOrAll::parse("").is_err());
    }

    #[test]
    fn ids_order_by_bytes() {
        let mut ids: Vec<ProductId> = ["b", "a", "B", "é", "aa", "z"]
            .iter()
            .map(|s| ProductId::parse(s).unwrap())
            .collect();
        ids.sort();
        let sorted: Vec<&str> = ids.iter().map(ProductId::as_str).collect();
        assert_eq!(sorted, ["B", "a", "aa", "b", "z", "é"]);
    }

    #[test]
    fn ids_serialize_as_plain_strings_and_deserialize_through_parse() {
        let id = ProductId::parse("p-1").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"p-1\"");
        assert_eq!(serde_json::from_str::<ProductId>("\"p-1\"").unwrap(), id);
        assert!(serde_json::from_str::<Category>("\"all\"").is_err());
        assert_eq!(serde_json::to_string(&CategoryOrAll::All).unwrap(), "\"all\"");
        assert_eq!(format!("{id:?}"), "ProductId(\"p-1\")");
    }

    #[test]
    fn error_messages_are_lowercase_and_say_what_to_do() {
        assert_eq!(IdError::Length { max: 128 }.to_string(), "must be 1 to 128 bytes");
        assert_eq!(
            IdError::ControlCharacter.to_string(),
            "must not contain control characters"
        );
        assert_eq!(IdError::Reserved.to_string(), "`all` is reserved");
    }
}
