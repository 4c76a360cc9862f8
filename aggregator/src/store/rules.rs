//! Recording rules made through the API, kept in the store under the `R` prefix so that they
//! survive restarts. The store keeps each rule's JSON as opaque bytes; the `rules` stage owns
//! what they mean.

use super::{Store, StoreError, keys};

impl Store {
    /// Every stored rule as (name, JSON), in name order.
    ///
    /// # Errors
    ///
    /// [`StoreError::Sled`] when reading fails, [`StoreError::Corrupt`] for a damaged record.
    pub(crate) fn rules(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut rules = Vec::new();
        for entry in self.inner.data.scan_prefix([keys::RULE]) {
            let (key, value) = entry?;
            let name = std::str::from_utf8(&key[1..]).map_err(|_| StoreError::Corrupt {
                key: keys::printable(&key),
                reason: "rule name is not UTF-8",
            })?;
            rules.push((name.to_owned(), keys::open(&key, &value)?.to_vec()));
        }
        Ok(rules)
    }

    /// Stores rule `name` as `json`, replacing any rule of that name, and returns once it is
    /// durable.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the rule written but not yet flushed.
    ///
    /// # Errors
    ///
    /// [`StoreError::Sled`] when the write or its flush fails.
    pub(crate) async fn put_rule(&self, name: &str, json: &[u8]) -> Result<(), StoreError> {
        self.inner.data.insert(keys::rule(name), keys::seal(json))?;
        self.inner.data.flush_async().await?;
        Ok(())
    }

    /// Deletes rule `name` durably; returns whether it existed.
    ///
    /// # Cancel safety
    ///
    /// As [`Store::put_rule`].
    ///
    /// # Errors
    ///
    /// [`StoreError::Sled`] when the delete or its flush fails.
    pub(crate) async fn delete_rule(&self, name: &str) -> Result<bool, StoreError> {
        let existed = self.inner.data.remove(keys::rule(name))?.is_some();
        self.inner.data.flush_async().await?;
        Ok(existed)
    }
}
