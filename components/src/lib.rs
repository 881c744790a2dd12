//! components
