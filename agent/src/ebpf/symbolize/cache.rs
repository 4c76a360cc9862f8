//! A bounded cache of resolved frames: two generations, so that memory stays within the bound
//! and frames used in the last generation survive a rotation.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// Maps keys to frame names, holding at most `capacity` entries. When the current generation
/// is full it becomes the old one and the previous old one is dropped; a hit in the old
/// generation moves the entry to the current one.
pub(crate) struct FrameCache<K> {
    current: HashMap<K, Arc<str>>,
    old: HashMap<K, Arc<str>>,
    capacity: usize,
}

impl<K: Eq + Hash + Copy> FrameCache<K> {
    pub(crate) fn new(capacity: usize) -> Self {
        FrameCache {
            current: HashMap::new(),
            old: HashMap::new(),
            capacity: capacity.max(2),
        }
    }

    pub(crate) fn get(&mut self, key: &K) -> Option<Arc<str>> {
        if let Some(name) = self.current.get(key) {
            return Some(Arc::clone(name));
        }
        let name = self.old.remove(key)?;
        self.insert(*key, Arc::clone(&name));
        Some(name)
    }

    pub(crate) fn insert(&mut self, key: K, name: Arc<str>) {
        if self.current.len() >= self.capacity / 2 {
            self.old = std::mem::take(&mut self.current);
        }
        self.current.insert(key, name);
    }

    pub(crate) fn len(&self) -> usize {
        self.current.len() + self.old.len()
    }

    /// Removes every entry whose key matches.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.current.retain(|key, _| keep(key));
        self.old.retain(|key, _| keep(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_bounded_and_keeps_what_is_used() {
        let mut cache = FrameCache::new(4);
        for key in 0..10u64 {
            cache.insert(key, Arc::from(key.to_string()));
            assert!(cache.len() <= 4);
            assert!(cache.get(&0).is_some(), "0 is used every round, at {key}");
        }
        assert!(cache.get(&1).is_none());
        cache.retain(|key| *key != 0);
        assert!(cache.get(&0).is_none());
    }
}
