//! What the pure qcow2 decoders ([`super::l2`]) find wrong with an entry. The converters add where
//! the entry is and report it as [`crate::Error::Corrupt`].

/// A table entry that contradicts the format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Qcow2Error {
    #[error("L2 table offset {offset:#x} is not cluster aligned")]
    MisalignedL2Table { offset: u64 },
    #[error("data cluster offset {offset:#x} is not cluster aligned")]
    MisalignedDataCluster { offset: u64 },
    #[error("unallocated cluster has allocated subclusters (bitmap {bitmap:#018x})")]
    UnallocatedWithSubclusters { bitmap: u64 },
    #[error("subclusters both allocated and zero (bitmap {bitmap:#018x})")]
    SubclustersAllocatedAndZero { bitmap: u64 },
}

/// The spec reference in the tests reports every failure as text.
#[cfg(test)]
impl From<Qcow2Error> for String {
    fn from(e: Qcow2Error) -> String {
        e.to_string()
    }
}

/// The unit tests written when the decoders returned text look into the message.
#[cfg(test)]
impl Qcow2Error {
    pub(crate) fn contains(&self, text: &str) -> bool {
        self.to_string().contains(text)
    }
}
