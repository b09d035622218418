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

/// Runs `script` (in `tests/`) with `args`, and checks it ends with "all checks passed".
/// Skipped (a failure under CI) when the Python lacks the `openai` package; `servers` starts
/// what the script talks to only when it will run.
fn run_script(script: &str, servers: impl FnOnce() -> Option<Vec<String>>) {
    let python = python();
    let has_openai = Command::new(&python).args(["-c", "import openai"]).status().is_ok_and(|s| s.success());
    if !has_openai {
        assert!(std::env::var_os("CI").is_none(), "{} has no `openai` package (.ci/run installs it)", python.display());
        eprintln!("skipped: {} has no `openai` package", python.display());
        return;
    }
    let Some(args) = servers() else { return };
    let path = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&python).arg(&path).args(&args).output().expect("python runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"));
}

#[test]
fn the_official_openai_client_gets_what_it_expects() {
    let mut server = None;
    run_script("openai_client.py", || {
        let s = server.insert(common::start(4, 16, 2048)?);
        Some(vec![s.base.clone(), common::MODEL.into()])
    });
}

/// Log-probabilities through the official client (`openai_logprobs.py`): a speculative server
/// and a plain one return the same tokens and values, whole and streamed.
#[test]
fn the_official_client_gets_the_same_logprobs_from_a_speculative_and_a_plain_server() {
    let mut servers = None;
    run_script("openai_logprobs.py", || {
        let (spec, plain) = servers.insert((common::start(2, 16, 2048)?, common::start_plain(2, 16, 2048)?));
        Some(vec![spec.base.clone(), plain.base.clone(), common::MODEL.into()])
    });
}
