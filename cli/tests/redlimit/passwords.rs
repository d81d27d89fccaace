//! Passwords given in a URL or with `--password-file`: printed nowhere, even when the URL does
//! not parse; a file's trailing line end is dropped, and a missing, unreadable or empty file is
//! refused.

use crate::support::example::dead_redis_url;
use crate::support::RedisServer;
use crate::{create_operator, run, text};

/// A password in a URL is printed nowhere, even when the URL does not parse (no `//`, no
/// scheme), comes from `REDIS_URL`, or names a host that does not answer.
#[test]
fn a_password_in_a_url_is_never_printed() {
    let secret = "hunter2-s3cret";
    let dead = dead_redis_url().replace("redis://", &format!("redis://u:{secret}@"));
    let malformed = [
        format!("redis//u:{secret}@127.0.0.1:6390/"),
        format!("redis:/u:{secret}@127.0.0.1:6390/"),
        format!("u:{secret}@127.0.0.1:6390"),
        format!("redis://u:{secret}@[::1"),
        format!("redis://u:{secret}@127.0.0.1:6390/abc"),
        format!("redis://u:{secret}@127.0.0.1:99999/"),
    ];
    // The arguments, the environment, the exit code.
    type Case = (Vec<String>, Vec<(&'static str, String)>, i32);
    let mut cases: Vec<Case> = Vec::new();
    for url in &malformed {
        for flag in ["--redis", "--redis-cluster"] {
            cases.push((vec![flag.into(), url.clone(), "limited".into()], vec![], 2));
        }
        let sentinel = vec![
            "--sentinel".into(),
            url.clone(),
            "--service".into(),
            "m".into(),
        ];
        cases.push(([sentinel, vec!["limited".into()]].concat(), vec![], 2));
        cases.push((vec!["limited".into()], vec![("REDIS_URL", url.clone())], 2));
    }
    cases.push((
        vec![
            "--redis".into(),
            dead.clone(),
            "suspend".into(),
            "k".into(),
            "1m".into(),
        ],
        vec![],
        1,
    ));
    cases.push((
        vec!["--json".into(), "inspect".into(), "k".into()],
        vec![("REDIS_URL", dead.clone())],
        1,
    ));
    cases.push((vec!["--help".into()], vec![("REDIS_URL", dead.clone())], 0));
    for (args, envs, code) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let envs: Vec<(&str, &str)> = envs.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let output = run(&args, &envs);
        let all = text(&output.stdout) + &text(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(*code),
            "{args:?} {envs:?}: {all}"
        );
        assert!(
            !all.contains(secret),
            "{args:?} {envs:?} printed the password: {all}"
        );
    }
}

/// `--password-file`: a trailing CRLF is dropped; a missing or unreadable file, or an empty
/// one, exits 2 naming the file, never its content.
#[test]
fn password_files() {
    let redis = RedisServer::start();
    create_operator(&redis, "file-s3cret");
    let url = format!("redis://operator@127.0.0.1:{}/", redis.port());
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let crlf = file("crlf", b"file-s3cret\r\n");
    let wrong = file("wrong", b"wrong-file-s3cret\n");
    let empty = file("empty", b"\n");
    let binary = file("binary", b"\xff\xfe");
    let missing = dir.path().join("missing").to_str().unwrap().to_owned();
    let a_dir = dir.path().to_str().unwrap().to_owned();
    let output = run(&["--redis", &url, "--password-file", &crlf, "limited"], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    for (path, code, words) in [
        (&wrong, 1, "AuthenticationFailed"),
        (&empty, 2, "empty"),
        (&binary, 2, "not UTF-8"),
        (&missing, 2, "No such file"),
        (&a_dir, 2, "directory"),
    ] {
        let output = run(
            &[
                "--redis",
                &url,
                "--password-file",
                path,
                "--json",
                "limited",
            ],
            &[],
        );
        let all = text(&output.stdout) + &text(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{path}: {all}");
        assert!(
            all.contains(words) && all.starts_with("error: "),
            "{path}: {all}"
        );
        assert!(!all.contains("file-s3cret"), "{path}: {all}");
    }
}
