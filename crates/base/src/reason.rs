//! Counting by reason: a closed set of reasons (or outcomes), each the
//! value of one label, and one value kept per reason ([`ByReason`]): the
//! metrics' counters by `reason` or `result`, the drain wait's counts of
//! probes it did not count.

use std::marker::PhantomData;

/// A closed set of reasons a count is kept by.
pub trait Reason: Copy + 'static {
    /// Every reason, in order: a reason's place here is its index.
    const ALL: &'static [Self];
    /// The label's value (`timeout`, `table_full`, ...).
    fn label(self) -> &'static str;
    /// Its place in [`Reason::ALL`].
    fn index(self) -> usize;
}

/// Declares a closed set of reasons, each with its label, and its
/// [`Reason`] impl: `reasons! { pub enum Incomplete { Timeout =
/// "timeout", ... } }`. A reason's place in the declaration is its index.
#[macro_export]
macro_rules! reasons {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $label:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )*
        }

        impl $crate::reason::Reason for $name {
            const ALL: &'static [$name] = &[$($name::$variant),*];
            fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)*
                }
            }
            fn index(self) -> usize {
                self as usize
            }
        }
    };
}

/// One `T` per reason of `R`.
#[derive(Debug)]
pub struct ByReason<R, T> {
    items: Box<[T]>,
    reason: PhantomData<R>,
}

impl<R: Reason, T> ByReason<R, T> {
    /// One value per reason, made by `make`.
    pub fn new(make: impl FnMut(R) -> T) -> Self {
        ByReason {
            items: R::ALL.iter().copied().map(make).collect(),
            reason: PhantomData,
        }
    }

    /// The value of `reason`.
    pub fn get(&self, reason: R) -> &T {
        &self.items[reason.index()]
    }

    /// Each reason with its value, in [`Reason::ALL`]'s order.
    pub fn iter(&self) -> impl Iterator<Item = (R, &T)> {
        R::ALL.iter().copied().zip(self.items.iter())
    }
}

impl<R: Reason, T: Default> Default for ByReason<R, T> {
    fn default() -> Self {
        ByReason::new(|_| T::default())
    }
}

impl<R, T: Clone> Clone for ByReason<R, T> {
    fn clone(&self) -> Self {
        ByReason {
            items: self.items.clone(),
            reason: PhantomData,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::reasons! {
        enum Why {
            Slow = "slow",
            Broken = "broken",
        }
    }

    #[test]
    fn each_reason_has_its_own_value_in_order() {
        let by = ByReason::new(|why: Why| why.label().len());
        assert_eq!(*by.get(Why::Broken), 6);
        let all: Vec<_> = by.iter().map(|(why, n)| (why.label(), *n)).collect();
        assert_eq!(all, [("slow", 4), ("broken", 6)]);
        let counts: ByReason<Why, u64> = ByReason::default();
        assert_eq!(*counts.get(Why::Slow), 0);
    }
}
