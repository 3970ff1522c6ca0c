//! The README's code must be exactly `examples/readme.rs` (which cargo builds
//! and CI can run), so the published snippet cannot rot.

#[test]
fn readme_snippet_is_the_example() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/readme.rs");
    let snippet = readme
        .split("```rust\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("README has a rust code block");
    assert!(
        example.ends_with(snippet),
        "README snippet and examples/readme.rs differ"
    );
}
