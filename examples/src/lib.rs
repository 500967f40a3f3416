//! Runnable dlock programs live in `examples/`.
