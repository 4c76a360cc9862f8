//! Properties of the stack tree: encoding round trips, merge algebra, truncation.
