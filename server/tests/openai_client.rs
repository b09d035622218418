//! The official `openai` Python client against the server (`openai_client.py`): it runs with
//! the Python of `SPECDEC_PYTHON`, else `target/openai-venv` (which `.ci/run` makes), else
//! `python3`; skipped when that Python lacks the `openai` package, a failure under CI.

mod common;

use std::path::PathBuf;
use std::process::Command;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SPECDEC_PYTHON") {
        return p.into();
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/openai-venv/bin/python");
    if venv.is_file() {
        venv
    } else {
        "python3".into()
    }
}

#[test]
fn the_official_openai_client_gets_what_it_expects() {
    let python = python();
    let has_openai = Command::new(&python).args(["-c", "import openai"]).status().is_ok_and(|s| s.success());
    if !has_openai {
        assert!(std::env::var_os("CI").is_none(), "{} has no `openai` package (.ci/run installs it)", python.display());
        eprintln!("skipped: {} has no `openai` package", python.display());
        return;
    }
    let Some(s) = common::start(4, 16, 2048) else { return };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let out = Command::new(&python).args([script, &s.base, common::MODEL]).output().expect("python runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "the openai client script failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"));
}

/// Log-probabilities through the official client (`openai_logprobs.py`): a speculative server
/// and a plain one return the same tokens and values, whole and streamed.
#[test]
fn the_official_client_gets_the_same_logprobs_from_a_speculative_and_a_plain_server() {
    let python = python();
    let has_openai = Command::new(&python).args(["-c", "import openai"]).status().is_ok_and(|s| s.success());
    if !has_openai {
        assert!(std::env::var_os("CI").is_none(), "{} has no `openai` package (.ci/run installs it)", python.display());
        eprintln!("skipped: {} has no `openai` package", python.display());
        return;
    }
    let Some(spec) = common::start(2, 16, 2048) else { return };
    let Some(plain) = common::start_plain(2, 16, 2048) else { return };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_logprobs.py");
    let out =
        Command::new(&python).args([script, &spec.base, &plain.base, common::MODEL]).output().expect("python runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "the openai logprobs script failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"));
}
