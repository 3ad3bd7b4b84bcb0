//! `megamoe`: the facade (placeholder until the foundation lands).
