//! Guards docs/BENCHMARKS.md against drift: every generated table in it must equal what
//! `fawn bench report` renders from the result files it names.

use std::path::Path;

#[test]
fn generated_tables_match_their_result_files() {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/BENCHMARKS.md");
    let text = std::fs::read_to_string(&doc).expect("read docs/BENCHMARKS.md");
    let base = doc.parent().expect("docs dir");
    let rendered = fawn_bench::report::render_document(&text, base).expect("render the generated tables");
    assert!(text.contains("<!-- report:"), "the document has no generated table");
    assert!(rendered == text, "docs/BENCHMARKS.md is stale: run `fawn bench report` and commit the result");
}
