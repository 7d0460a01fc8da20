//! Label sets: a closed set of values, each the value of one metric
//! label (or one key of `GET /drain`), declared once where its type lives
//! by deriving strum's `EnumIter` and `IntoStaticStr` (its variants and
//! their labels: `#[strum(serialize_all = "snake_case")]`, or a variant's
//! own `#[strum(serialize = "...")]`), which makes it a [`Label`] (and,
//! with `#[serde(into = "&'static str")]`, the same word in JSON: serde
//! serializes it as the label strum made); and one
//! value kept per label ([`ByReason`]): the metrics' counters by `reason`
//! or `result`, the drain wait's counts of probes it did not count.

use serde::ser::SerializeMap;

/// A closed set of values, each with its label: every enum that derives
/// strum's `EnumIter` and `IntoStaticStr` (and `Copy`, `PartialEq`).
pub trait Label: Copy + PartialEq + 'static {
    /// The label's value (`timeout`, `table_full`, ...).
    fn label(self) -> &'static str;
    /// Every value, in the order of its declaration.
    fn all() -> impl Iterator<Item = Self>;
}

impl<T> Label for T
where
    T: strum::IntoEnumIterator + Into<&'static str> + Copy + PartialEq + 'static,
{
    fn label(self) -> &'static str {
        self.into()
    }

    fn all() -> impl Iterator<Item = Self> {
        T::iter()
    }
}

/// One `T` per value of the label set `R`.
#[derive(Debug)]
pub struct ByReason<R, T> {
    items: Box<[(R, T)]>,
}

impl<R: Label, T> ByReason<R, T> {
    /// One value per label, made by `make`.
    pub fn new(mut make: impl FnMut(R) -> T) -> Self {
        ByReason {
            items: R::all().map(|r| (r, make(r))).collect(),
        }
    }

    /// The value of `reason` (a scan of a handful: no hashing, no
    /// allocation).
    pub fn get(&self, reason: R) -> &T {
        let (_, value) = self
            .items
            .iter()
            .find(|(r, _)| *r == reason)
            .expect("every value of the set has its item");
        value
    }

    /// Each label with its value, in the order of its declaration.
    pub fn iter(&self) -> impl Iterator<Item = (R, &T)> {
        self.items.iter().map(|(r, t)| (*r, t))
    }
}

impl<R: Label, T: Default> Default for ByReason<R, T> {
    fn default() -> Self {
        ByReason::new(|_| T::default())
    }
}

impl<R: Copy, T: Clone> Clone for ByReason<R, T> {
    fn clone(&self) -> Self {
        ByReason {
            items: self.items.clone(),
        }
    }
}

impl<R: PartialEq, T: PartialEq> PartialEq for ByReason<R, T> {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items
    }
}

/// In JSON: each label, its value (`{"table_full": 0, ...}`).
impl<R: Label, T: serde::Serialize> serde::Serialize for ByReason<R, T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.items.len()))?;
        for (r, t) in self.iter() {
            map.serialize_entry(r.label(), t)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr, serde::Serialize)]
    #[strum(serialize_all = "snake_case")]
    #[serde(into = "&'static str")]
    enum Why {
        Slow,
        #[strum(serialize = "broke")]
        Broken,
    }

    #[test]
    fn each_label_has_its_own_value_in_order() {
        let by = ByReason::new(|why: Why| why.label().len());
        assert_eq!(*by.get(Why::Broken), 5);
        let all: Vec<_> = by.iter().map(|(why, n)| (why.label(), *n)).collect();
        assert_eq!(all, [("slow", 4), ("broke", 5)]);
        let counts: ByReason<Why, u64> = ByReason::default();
        assert_eq!(*counts.get(Why::Slow), 0);
        assert_eq!(serde_json::to_string(&counts).unwrap(), r#"{"slow":0,"broke":0}"#);
    }

    #[test]
    fn a_label_serializes_as_its_label() {
        for why in Why::all() {
            assert_eq!(serde_json::to_value(why).unwrap(), why.label());
        }
        assert_eq!(serde_json::to_string(&Why::Broken).unwrap(), r#""broke""#);
    }
}
