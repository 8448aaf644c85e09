//! The persisted environment (`<root>/env.json`, 0600). (Skeleton.)
