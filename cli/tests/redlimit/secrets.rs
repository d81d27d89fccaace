//! Secrets `redlimit` is given: a password with `,`, `@`, `:`, `%`, `+` or an escape, in a
//! URL's user info or a Unix socket URL's query, through `--redis`, `--redis-cluster`,
//! `--sentinel` and `REDIS_URL`, is printed nowhere in any form; a list is cut between URLs,
//! not inside a password; and the header secret can come from a file, off the command line.

use http::StatusCode;
use redlimit::key::HeaderKey;
use redlimit::{Quota, RateLimitLayer};

use crate::support::{self, free_port, RedisCluster, RedisServer};
use crate::{create_operator, file_with, run, text};

/// A password as written in a URL, and the pieces of it that no output may hold. Each piece is
/// letters and digits only, which no encoding changes: whatever the form a message shows the
/// password in (as written, decoded, encoded again, cut at a comma), a piece would show.
struct Password {
    written: String,
    pieces: [&'static str; 2],
}

/// `Kq7a<between>Zx9b`-like passwords: two pieces around the hostile characters, as written.
fn password(first: &'static str, between: &str, second: &'static str) -> Password {
    Password {
        written: format!("{first}{between}{second}"),
        pieces: [first, second],
    }
}

/// A TCP port on which nothing listens.
fn dead_port() -> u16 {
    free_port()
}

/// A command line and the environment it runs in.
type Run = (Vec<String>, Vec<(&'static str, String)>);

/// The ways a URL reaches the command: each flag, and `REDIS_URL`; a list flag is given the
/// URL twice, as a list of two nodes.
fn routes(url: &str) -> Vec<Run> {
    let list = format!("{url},{url}");
    let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    vec![
        (owned(&["--redis", url, "limited"]), vec![]),
        (owned(&["--redis-cluster", &list, "limited"]), vec![]),
        (
            owned(&["--sentinel", &list, "--service", "m", "limited"]),
            vec![],
        ),
        (
            owned(&["inspect", "k"]),
            vec![("REDIS_URL", url.to_owned())],
        ),
    ]
}

/// Every URL form with a hostile password, through every route, exits non-zero without a
/// piece of the password on stdout or stderr; the error still names the URL's host or socket.
#[test]
fn a_password_is_printed_in_no_form_through_any_flag() {
    let socket_dir = tempfile::tempdir().expect("a temporary directory");
    let socket = socket_dir.path().join("no-redis.sock");
    let socket = socket.to_str().unwrap().to_owned();
    // The URL (given the password as written), the exit status, and what the error names.
    type Form = (Password, fn(&str, u16, &str) -> String, i32, bool);
    let tcp = |pw: &str, port: u16, _: &str| format!("redis://operator:{pw}@127.0.0.1:{port}/");
    let tcp_no_user = |pw: &str, port: u16, _: &str| format!("redis://:{pw}@127.0.0.1:{port}/");
    let tcp_bad_db = |pw: &str, port: u16, _: &str| format!("redis://u:{pw}@127.0.0.1:{port}/x");
    let tcp_pass = |pw: &str, port: u16, _: &str| format!("redis://127.0.0.1:{port}/?pass={pw}");
    let tcp_password =
        |pw: &str, port: u16, _: &str| format!("redis://127.0.0.1:{port}/?password={pw}");
    let unix = |pw: &str, _: u16, path: &str| format!("redis+unix://{path}?user=op&pass={pw}");
    let unix_short = |pw: &str, _: u16, path: &str| format!("unix://{path}?pass={pw}");
    let unix_bad_db = |pw: &str, _: u16, path: &str| format!("unix://{path}?db=x&pass={pw}");
    let unix_password =
        |pw: &str, _: u16, path: &str| format!("redis+unix://{path}?password={pw}&db=1");
    let forms: Vec<Form> = vec![
        (password("Kq7a", ",", "Zx9b"), tcp, 1, true),
        (password("Kq7c", "@", "Zx9d"), tcp, 1, true),
        (password("Kq7e", ":", "Zx9f"), tcp_no_user, 1, true),
        (password("Kq7g", "%2C", "Zx9h"), tcp, 1, true),
        (password("Kq7i", "+", "Zx9j"), tcp, 1, true),
        (password("Kq7k", "%25", "Zx9l"), tcp, 1, true),
        (password("Kq7m", "%", "Zx9n"), tcp, 1, true),
        (password("Kq7o", ",:@", "Zx9p"), tcp_bad_db, 2, true),
        (password("Kq7q", "%2B", "Zx9r"), tcp_pass, 1, true),
        (password("Kq7s", "+", "Zx9t"), tcp_password, 1, true),
        (password("Kq7u", "%2B", "Zx9v"), unix, 1, false),
        (password("Kq7w", "+", "Zx9x"), unix, 1, false),
        (password("Kq7y", ",", "Zx9z"), unix_short, 1, false),
        (password("Kq8a", "%2C", "Zx8b"), unix_short, 1, false),
        (password("Kq8c", "%40:", "Zx8d"), unix_bad_db, 2, false),
        (password("Kq8e", "%", "Zx8f"), unix_password, 1, false),
        (password("Kq8g", "@", "Zx8h"), unix, 1, false),
    ];
    let mut faults = Vec::new();
    let mut runs = 0;
    for (password, url_of, code, tcp) in &forms {
        let port = dead_port();
        let url = url_of(&password.written, port, &socket);
        let names = if *tcp {
            format!("127.0.0.1:{port}")
        } else {
            socket.clone()
        };
        for (args, envs) in routes(&url) {
            runs += 1;
            let flag = args[0].clone();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let envs: Vec<(&str, &str)> = envs.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let output = run(&args, &envs);
            let all = text(&output.stdout) + &text(&output.stderr);
            let what = format!("{flag} {url}");
            if let Some(piece) = password.pieces.iter().find(|p| all.contains(*p)) {
                faults.push(format!("{what}: printed {piece:?}: {all:?}"));
                continue;
            }
            // A list of Unix sockets or of sentinels fails its own ways: not 0 is all it owes.
            let status = output.status.code();
            let single = flag == "--redis" || flag == "inspect";
            if single && status != Some(*code) {
                faults.push(format!("{what}: exit {status:?}, not {code}: {all:?}"));
            } else if status.is_none_or(|code| code == 0) {
                faults.push(format!("{what}: exit {status:?}: {all:?}"));
            } else if single && !all.contains(&names) {
                faults.push(format!("{what}: the error does not name {names}: {all:?}"));
            }
        }
    }
    assert!(
        faults.is_empty(),
        "{} of {runs} runs:\n{}",
        faults.len(),
        faults.join("\n")
    );
}

/// A password with a comma (and `@`, `:`) works through `--redis-cluster`: the list is cut
/// between its URLs, not at the password's comma, and the command does what it says.
#[test]
fn a_comma_in_a_password_does_not_cut_the_list() {
    let cluster = RedisCluster::start();
    let secret = "s3cret,xyz@p:q";
    for node in cluster.nodes() {
        create_operator(node, secret);
    }
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|node| format!("redis://operator:{secret}@127.0.0.1:{}/", node.port()))
        .collect();
    let list = urls.join(",");
    for args in [
        vec!["--redis-cluster", &list, "suspend", "t", "1m"],
        vec!["--redis-cluster", &list, "limited"],
    ] {
        let output = run(&args, &[]);
        let all = text(&output.stdout) + &text(&output.stderr);
        assert!(!all.contains("s3cret"), "{args:?}: printed it: {all}");
        assert!(output.status.success(), "{args:?}: {all}");
    }
    let output = run(&["--redis-cluster", &list, "inspect", "t"], &[]);
    let stdout = text(&output.stdout);
    assert!(stdout.contains("  suspended: "), "{stdout}");
    assert!(!stdout.contains("  suspended: no"), "{stdout}");
    // A wrong password with a comma: exit 1, neither password printed.
    let wrong = list.replace("s3cret,xyz", "wr0ng,pw");
    let output = run(&["--redis-cluster", &wrong, "limited"], &[]);
    let all = text(&output.stdout) + &text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{all}");
    assert!(
        !all.contains("wr0ng") && !all.contains("s3cret"),
        "printed it: {all}"
    );
}

/// `--header-secret-file` hashes as the layer with that secret does (its newline dropped), as
/// `REDLIMIT_HEADER_SECRET` and `--header-secret` do; `--help` says to prefer it or the
/// variable to the flag, which `ps` shows.
#[tokio::test]
async fn the_header_secret_from_a_file() {
    let redis = RedisServer::start();
    let limiter = support::Ctx::default().redis(&redis);
    let quota = Quota::per_minute(100).unwrap();
    let key = HeaderKey::named("x-api-key").unwrap();
    let layer = RateLimitLayer::new(limiter, quota, key.with_secret("fleet-s3cret"));
    let scope = layer.scope().to_owned();
    let url = redis.url();
    let file = file_with(b"fleet-s3cret\n");
    let path = file.path().to_str().unwrap();
    let with = |command: &[&'static str]| -> Vec<String> {
        let flags = [
            "--redis",
            &url,
            "--scope",
            &scope,
            "--header",
            "x-api-key",
            "--header-secret-file",
            path,
        ];
        flags.iter().chain(command).map(|s| s.to_string()).collect()
    };
    let suspend = with(&["suspend", "k-123", "1m"]);
    let suspend: Vec<&str> = suspend.iter().map(String::as_str).collect();
    let output = run(&suspend, &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let status = crate::commands::through_layer(&layer, "k-123").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // The key the file names is the one the variable and the flag name.
    let inspect = with(&["inspect", "k-123"]);
    let inspect: Vec<&str> = inspect.iter().map(String::as_str).collect();
    let from_file = text(&run(&inspect, &[]).stdout);
    let from_env = [("REDLIMIT_HEADER_SECRET", "fleet-s3cret")];
    let without: Vec<&str> = inspect
        .iter()
        .copied()
        .filter(|a| *a != "--header-secret-file" && *a != path)
        .collect();
    let by_env = text(&run(&without, &from_env).stdout);
    // Their first lines: the key and where it is stored.
    assert!(
        from_file.contains("  suspended: ") && from_file.lines().next() == by_env.lines().next(),
        "{from_file}\n{by_env}"
    );

    for (args, message) in [
        (
            vec!["--header-secret-file", path, "inspect", "k"],
            "needs --header NAME",
        ),
        (
            vec![
                "--header",
                "x-api-key",
                "--header-secret-file",
                "/nonexistent/s",
                "inspect",
                "k",
            ],
            "--header-secret-file /nonexistent/s",
        ),
        (
            vec![
                "--header",
                "x-api-key",
                "--header-secret",
                "s",
                "--header-secret-file",
                path,
                "inspect",
                "k",
            ],
            "cannot be used with",
        ),
    ] {
        let args = [vec!["--redis", url.as_str()], args].concat();
        let output = run(&args, &[]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    let empty = file_with(b"\n");
    let args = [
        "--redis",
        &url,
        "--header",
        "x-api-key",
        "--header-secret-file",
        empty.path().to_str().unwrap(),
        "inspect",
        "k",
    ];
    let output = run(&args, &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains(": empty"));

    let help = text(&run(&["--help"], &[]).stdout);
    let line = help
        .lines()
        .find(|line| line.trim_start().starts_with("--header-secret <SECRET>"))
        .expect("--header-secret in --help");
    assert!(
        line.contains("`ps`")
            && line.contains("prefer --header-secret-file or $REDLIMIT_HEADER_SECRET"),
        "{line}"
    );
}
