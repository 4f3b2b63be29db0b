//! Reading JSON an agent wrote, leniently: the fold reads ACP frames through small serde views
//! (`acp/fold/views.rs`) whose fields must never fail the whole frame. A field that is missing
//! or of another shape reads as absent, as if it were not there.
//!
//! - scalars: `#[serde_as(deserialize_as = "DefaultOnError")]` (serde_with) on an `Option`;
//! - scalars whose absence means something other than a wrong shape: [`Field`];
//! - JSON kept as it came (to log, show or pass on): [`present`];
//! - nested objects: [`object`] and [`objects`] — serde's derive would also read an array as a
//!   struct, field by field, which no ACP sender means — and [`present_object`] when a field
//!   that is there counts even in another shape.
//!
//! A view built from these never fails on any JSON value, so `T::deserialize(&value)` of a view
//! only fails when a field helper is missing: [`view`] reads anything that is not an object as
//! the view's default.

use std::{fmt, marker::PhantomData};

use serde::{
    Deserialize, Deserializer,
    de::{IgnoredAny, MapAccess, SeqAccess, Visitor, value::MapAccessDeserializer},
};
use serde_json::Value;

/// `value` read as the view `T`; anything but an object (and a view that cannot be read, which a
/// view of lenient fields never is) gives `T::default()`.
pub fn view<'a, T: Deserialize<'a> + Default>(value: &'a Value) -> T {
    if !value.is_object() {
        return T::default();
    }
    T::deserialize(value).unwrap_or_default()
}

/// A field that is there, even as `null` (which a plain `Option<Value>` reads as absent). Use with
/// `#[serde(default)]`, so a missing field is `None`.
pub fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// A field that tells "missing" from "there, in another shape", which a `DefaultOnError`
/// `Option` reads alike (JSON-RPC tells a reply from a request by whether `method` is there at
/// all). For scalars only: a struct would be read from an array field by field. Use with
/// `#[serde(default)]`, so a missing field is [`Field::Missing`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Field<T> {
    #[default]
    Missing,
    /// There, but not a `T` (`null` included).
    Other,
    Is(T),
}

impl<T> Field<T> {
    pub fn is_missing(&self) -> bool {
        matches!(self, Self::Missing)
    }

    /// The value when it is a `T`.
    pub fn ok(self) -> Option<T> {
        match self {
            Self::Is(value) => Some(value),
            Self::Missing | Self::Other => None,
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Views are read from a parsed `Value`, where a value that fails leaves nothing
        // half-read behind (as with `DefaultOnError`).
        Ok(T::deserialize(deserializer).map_or(Self::Other, Self::Is))
    }
}

/// A field that is there in any shape (even `null`), read as the view `T` when it is an object
/// and as `T::default()` otherwise; `None` only when it is missing. Use with
/// `#[serde(default)]`.
pub fn present_object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    object(deserializer).map(|t| Some(t.unwrap_or_default()))
}

/// A JSON object read as the view `T`; anything else is `None`. Use with `#[serde(default)]`.
pub fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_any(Shape::<T, Object>(PhantomData))
}

/// A JSON array, each element read as the view `T` (an element that is not an object reads as
/// `T::default()`); anything else is `None`. Use with `#[serde(default)]`.
pub fn objects<'de, D, T>(deserializer: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    deserializer.deserialize_any(Shape::<T, Array>(PhantomData))
}

/// One element of [`objects`].
struct Element<T>(T);

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Element<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        object(deserializer).map(|t| Element(t.unwrap_or_default()))
    }
}

/// What a [`Shape`] visitor accepts.
struct Object;
struct Array;

/// Reads the wanted shape (`K`) as `Some`, and every other JSON value — consumed whole — as
/// `None`.
struct Shape<T, K>(PhantomData<(T, K)>);

trait Wanted<'de, T>: Sized {
    type Value;
    fn map<A: MapAccess<'de>>(map: A) -> Result<Option<Self::Value>, A::Error>;
    fn seq<A: SeqAccess<'de>>(seq: A) -> Result<Option<Self::Value>, A::Error>;
}

impl<'de, T: Deserialize<'de>> Wanted<'de, T> for Object {
    type Value = T;
    fn map<A: MapAccess<'de>>(map: A) -> Result<Option<T>, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(Some)
    }
    fn seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<T>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

impl<'de, T: Deserialize<'de> + Default> Wanted<'de, T> for Array {
    type Value = Vec<T>;
    fn map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Vec<T>>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Vec<T>>, A::Error> {
        let mut items = Vec::new();
        while let Some(Element(item)) = seq.next_element::<Element<T>>()? {
            items.push(item);
        }
        Ok(Some(items))
    }
}

impl<'de, T, K: Wanted<'de, T>> Visitor<'de> for Shape<T, K> {
    type Value = Option<K::Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        K::map(map)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        K::seq(seq)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Deserialize, Default)]
    #[serde(default)]
    struct Probe<'a> {
        #[serde(borrow)]
        method: Field<&'a str>,
        #[serde(deserialize_with = "present_object")]
        result: Option<Inner>,
    }

    #[derive(Deserialize, Default, Debug, PartialEq)]
    #[serde(default)]
    struct Inner {
        n: Option<u64>,
    }

    #[test]
    fn a_field_tells_missing_from_another_shape_from_the_wanted_one() {
        let missing = json!({});
        assert_eq!(view::<Probe>(&missing).method, Field::Missing);
        for other in [json!(null), json!(1), json!(["m"]), json!({"m": 1})] {
            let frame = json!({ "method": other });
            let method = view::<Probe>(&frame).method;
            assert_eq!(method, Field::Other, "{frame}");
            assert!(!method.is_missing());
            assert_eq!(method.ok(), None);
        }
        let frame = json!({"method": "m"});
        assert_eq!(view::<Probe>(&frame).method.ok(), Some("m"));
    }

    #[test]
    fn a_present_object_is_some_in_any_shape_and_read_only_when_an_object() {
        let missing = json!({});
        assert_eq!(view::<Probe>(&missing).result, None);
        for other in [
            json!(null),
            json!("r"),
            json!(3),
            json!([{"n": 1}]),
            json!([1]),
        ] {
            let frame = json!({ "result": other });
            assert_eq!(
                view::<Probe>(&frame).result,
                Some(Inner::default()),
                "{frame}"
            );
        }
        let frame = json!({"result": {"n": 4, "extra": true}});
        assert_eq!(view::<Probe>(&frame).result, Some(Inner { n: Some(4) }));
    }

    #[test]
    fn a_view_of_anything_but_an_object_is_its_default() {
        for value in [
            json!(null),
            json!("method"),
            json!([{"method": "m"}]),
            json!(2.5),
        ] {
            let probe: Probe = view(&value);
            assert!(
                probe.method.is_missing() && probe.result.is_none(),
                "{value}"
            );
        }
    }
}
