//! A newcomer's first hour (issue 30): each command's `--help` shows that command's options only, env hints
//! name their variable without a dangling `=`, `--port` is answered with `--listen`, a port in use fails
//! before anything is written to disk, and logs written to a file carry no colour codes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn rankgate() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rankgate"));
    command.env_remove("RANKGATE_LOG").env_remove("NO_COLOR");
    command
}

fn help_of(args: &[&str]) -> String {
    let output = rankgate().args(args).arg("--help").output().unwrap();
    assert!(output.status.success(), "{args:?} --help: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// The long options a help text lists, e.g. `--data-dir`.
fn options_in(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line
                .strip_prefix("-h, ")
                .or(line.strip_prefix("-V, "))
                .unwrap_or(line);
            line.starts_with("--")
                .then(|| line.split([' ', '=', ',']).next().unwrap().to_string())
        })
        .collect()
}

#[test]
fn each_command_lists_its_own_options_only() {
    let server_only = [
        "--listen",
        "--kafka",
        "--kafka-topic",
        "--admin-keys",
        "--ingest-keys",
        "--token-secret",
        "--token-secret-file",
        "--stream",
        "--cache-max-age-seconds",
    ];
    let serve = options_in(&help_of(&["serve"]));
    for option in server_only
        .iter()
        .chain(&["--data-dir", "--config", "--database", "--redis"])
    {
        assert!(
            serve.iter().any(|o| o == option),
            "serve lacks {option}: {serve:?}"
        );
    }
    assert!(
        !serve.iter().any(|o| o == "--port"),
        "--port is hidden: {serve:?}"
    );
    let store_commands: [&[&str]; 6] = [
        &["ingest"],
        &["verify"],
        &["rebuild"],
        &["replay"],
        &["migrate"],
        &["catalog", "load"],
    ];
    for command in store_commands {
        let options = options_in(&help_of(command));
        for option in server_only {
            assert!(
                !options.iter().any(|o| o == option),
                "{command:?} --help lists {option}: {options:?}"
            );
        }
        assert!(
            options.len() <= 10,
            "{command:?} lists {} options: {options:?}",
            options.len()
        );
        assert!(
            options.iter().any(|o| o == "--database"),
            "{command:?}: {options:?}"
        );
    }
    assert!(options_in(&help_of(&["rebuild"])).iter().any(|o| o == "--redis"));
    assert!(!options_in(&help_of(&["ingest"])).iter().any(|o| o == "--redis"));
}

#[test]
fn env_hints_name_the_variable_without_a_dangling_equals_sign() {
    let commands: [&[&str]; 9] = [
        &["serve"],
        &["ingest"],
        &["verify"],
        &["rebuild"],
        &["replay"],
        &["migrate"],
        &["catalog", "load"],
        &["relay"],
        &["queue", "verify-draw"],
    ];
    let mut hints = 0;
    for command in commands {
        let help = help_of(command);
        for hint in help.match_indices("[env: ") {
            let rest = &help[hint.0..];
            let end = rest.find(']').expect("a closed hint");
            let hint = &rest[..=end];
            assert!(!hint.contains('='), "{command:?}: {hint}");
            hints += 1;
        }
    }
    assert!(hints > 20, "only {hints} env hints found");
}

#[test]
fn port_is_answered_with_listen() {
    let output = rankgate().args(["serve", "--port", "9090"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--listen 127.0.0.1:9090"), "{stderr}");
}

#[test]
fn a_port_in_use_fails_before_the_data_dir_is_created() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("fresh");
    let output = rankgate()
        .args(["serve", "--listen", &address, "--data-dir"])
        .arg(&data_dir)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&address) && stderr.contains("--listen"),
        "{stderr}"
    );
    assert!(
        !data_dir.exists(),
        "the data dir was created before the bind failed"
    );
}

#[test]
fn logs_written_to_a_file_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = rankgate()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut log = String::new();
    while !log.contains("rankgate listening") && Instant::now() < deadline {
        if stderr.read_line(&mut log).unwrap() == 0 {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(log.contains("rankgate listening"), "{log}");
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a log file: {log:?}");
}
