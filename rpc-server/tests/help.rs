//! `rpc-server --help` names every flag: those of the binary's module doc and those its
//! code reads. Needs no etcd.

use std::process::Command;

/// The `--flags` in `text`.
fn flags(text: &str) -> Vec<String> {
    let mut flags: Vec<String> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(str::to_owned)
        .collect();
    flags.sort();
    flags.dedup();
    flags
}

#[test]
fn help_lists_every_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
        .arg("--help")
        .output()
        .expect("run rpc-server --help");
    assert!(output.status.success(), "{output:?}");
    let help = String::from_utf8(output.stdout).expect("UTF-8 help");

    let source = include_str!("../src/main.rs");
    let module_doc: String = source
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    // What the code reads: `flag(&args, "--name")` and `flag_values(&args, "--name")`.
    let read: String = source
        .split("&args, \"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect::<Vec<_>>()
        .join(" ");
    let known = flags(&(module_doc + " " + &read));
    assert!(known.len() >= 13, "too few flags found: {known:?}");
    let listed = flags(&help);
    let missing: Vec<_> = known.iter().filter(|f| !listed.contains(f)).collect();
    assert!(missing.is_empty(), "--help misses {missing:?}:\n{help}");
}

/// Runs `rpc-server args…`, which must fail, and returns its stderr.
fn refused(args: &[&str]) -> String {
    refused_with(args).1
}

/// Runs `rpc-server args…`, which must fail, and returns its exit code and stderr.
fn refused_with(args: &[&str]) -> (i32, String) {
    let (code, _, err) = refused_outputs(args);
    (code, err)
}

/// [`refused_with`], with standard output too: (exit code, stdout, stderr).
fn refused_outputs(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
        .args(args)
        .output()
        .expect("run rpc-server");
    assert!(
        !output.status.success(),
        "{args:?} was accepted: {output:?}"
    );
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A mistake in the command line or the config file exits 2, a failure at run time
/// 1: a supervisor that restarts on failure can tell a typo (which a restart will not
/// fix) from a port in use. (Both exited 1.)
#[test]
fn usage_errors_exit_2_and_failures_1() {
    let (code, err) = refused_with(&["--lisen", "tcp://127.0.0.1:0"]);
    assert_eq!(code, 2, "{err}");
    let (code, err) = refused_with(&["--listen"]);
    assert_eq!(code, 2, "{err}");
    let (code, err) = refused_with(&["--config", "/nonexistent/rpc-server.conf"]);
    assert_eq!(code, 2, "{err}");
    // Values and settings that no restart mends exit 2 too (they exited 1, and a unit
    // with Restart=on-failure restarted them until its start limit).
    for args in [
        &["--log", "jsn"][..],
        &["--ttl-s", "0"],
        &["--ttl-s", "abc"],
        &["--register", "tcp://127.0.0.1:1"],
        &["--tls-cert", "a.pem"],
        &[
            "--listen",
            "tcp://127.0.0.1:0",
            "--tls-cert",
            "a.pem",
            "--tls-key",
            "b.pem",
        ],
        &[
            "--listen",
            "tcp://0.0.0.0:0",
            "--register",
            "etcd://127.0.0.1:1/kv",
        ],
        &["--advertise", "tcp://0.0.0.0:7000"],
        &["--name", "caf\u{e9}"],
        // Listen URIs and the admin address that cannot work, whatever the machine
        // (from a review: all exited 1).
        &["--listen", "tls://127.0.0.1:0"],
        &["--listen", "grpcs://127.0.0.1:0"],
        &["--listen", "foo://127.0.0.1:0"],
        &["--listen", "tcp://127.0.0.1:99999"],
        &["--listen", "tcp://127.0.0.1"],
        &["--listen", "127.0.0.1:7000"],
        &["--listen", "static://127.0.0.1:1,127.0.0.1:2"],
        &["--admin", "notanaddr"],
        &["--admin", "localhost:99999"],
        &["--admin", "::1:9000"],
        &[
            "--listen",
            "tls://127.0.0.1:0",
            "--tls-cert=",
            "--tls-key",
            "b.pem",
        ],
        // etcd's security without --register, and halves of pairs.
        &["--etcd-ca", "ca.pem"],
        &["--etcd-user", "root", "--etcd-password-file", "pw"],
        &[
            "--register",
            "etcd://127.0.0.1:1/kv",
            "--etcd-cert",
            "client.pem",
        ],
        &["--register", "etcd://127.0.0.1:1/kv", "--etcd-user", "root"],
    ] {
        let (code, err) = refused_with(args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
    // So is etcd's password file.
    let (code, err) = refused_with(&[
        "--listen",
        "tcp://127.0.0.1:0",
        "--register",
        "etcd://127.0.0.1:1/kv",
        "--etcd-user",
        "root",
        "--etcd-password-file",
        "/nonexistent/etcd-password",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--etcd-password-file /nonexistent/etcd-password"),
        "{err}"
    );
    // A certificate file that is not there (yet: a secret not mounted) is a failure
    // at run time.
    let (code, err) = refused_with(&[
        "--listen",
        "tls://127.0.0.1:0",
        "--tls-cert",
        "/nonexistent/cert.pem",
        "--tls-key",
        "/nonexistent/key.pem",
    ]);
    assert_eq!(code, 1, "{err}");
    // The same with the scheme in capitals: `TLS://` is a TLS listener (the check for
    // TLS files no listener uses compared case-sensitively, and refused it with 2).
    let (code, err) = refused_with(&[
        "--listen",
        "TLS://127.0.0.1:0",
        "--tls-cert",
        "/nonexistent/cert.pem",
        "--tls-key",
        "/nonexistent/key.pem",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("/nonexistent/cert.pem"), "{err}");
    // An admin host name that does not resolve (now: DNS may come back) is a failure
    // at run time, not a mistake in the settings (it exited 2).
    let (code, err) = refused_with(&["--admin", "no-such-host.invalid:9000"]);
    assert_eq!(code, 1, "{err}");
    // So is a certificate every client would refuse (it started, and every TLS
    // handshake failed).
    let tls = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tls/");
    let (cert, key) = (format!("{tls}expired.pem"), format!("{tls}expired.key"));
    let (code, err) = refused_with(&[
        "--listen",
        "tls://127.0.0.1:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("expired on 2001-12-31"), "{err}");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = format!("tcp://{}", busy.local_addr().unwrap());
    let (code, err) = refused_with(&["--listen", &at]);
    assert_eq!(code, 1, "{err}");
}

/// `--advertise auto` with a Unix socket listener first would register its path,
/// which clients on other hosts would dial on their own machine: refused, with what
/// to give instead (a review of the server binary).
#[test]
fn a_socket_path_is_not_advertised_by_default() {
    let path = std::env::temp_dir().join(format!("rpc-server-adv-{}.sock", std::process::id()));
    let listen = format!("unix://{}", path.display());
    let err = refused(&["--listen", &listen, "--register", "etcd://127.0.0.1:1/kv"]);
    assert!(err.contains("a socket path only clients on"), "{err}");
    assert!(err.contains("--advertise tcp://HOST:PORT"), "{err}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn unknown_options_and_bad_values_are_refused_by_name() {
    // A misspelt option used to be ignored: the server started with its defaults.
    let err = refused(&["--lisen", "tcp://127.0.0.1:0"]);
    assert!(err.contains("unknown option \"--lisen\""), "{err}");
    let err = refused(&["--admin", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]);
    assert!(err.contains("--admin and --metrics"), "{err}");
    let err = refused(&["--name", "a", "--name=b"]);
    assert!(err.contains("--name is given twice"), "{err}");
    let err = refused(&["--listen", "tcp://127.0.0.1:0", "stray"]);
    assert!(err.contains("unexpected argument \"stray\""), "{err}");
    let err = refused(&["--ttl-s", "abc"]);
    assert!(err.contains("--ttl-s \"abc\""), "{err}");
    assert!(!err.contains("ParseIntError"), "a Debug form: {err}");
    let err = refused(&["--max-frame-len", "0"]);
    assert!(err.contains("--max-frame-len 0: give at least 1"), "{err}");
    let err = refused(&["--max-unsent-answer-bytes", "lots"]);
    assert!(err.contains("--max-unsent-answer-bytes \"lots\""), "{err}");
    let err = refused(&["--listen"]);
    assert!(err.contains("--listen needs a value"), "{err}");
    let dir = std::env::temp_dir().join(format!("rpc-server-help-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("bad.conf");
    std::fs::write(&config, "listen tcp://127.0.0.1:0\nbogus 1\n").unwrap();
    let err = refused(&["--config", config.to_str().unwrap()]);
    assert!(
        err.contains("bad.conf:2: unknown option \"bogus\""),
        "{err}"
    );
    // A one-valued option twice in the file, as on the command line.
    std::fs::write(
        &config,
        "listen tcp://127.0.0.1:0\nadmin 127.0.0.1:0\nmetrics 127.0.0.1:0\n",
    )
    .unwrap();
    let err = refused(&["--config", config.to_str().unwrap()]);
    assert!(
        err.contains("bad.conf:3: admin and metrics (its older name) are both given"),
        "{err}"
    );
    // Any other option twice is named alone (the aside about admin and metrics was
    // printed for every option: from a review).
    std::fs::write(&config, "name a\nname b\n").unwrap();
    let err = refused(&["--config", config.to_str().unwrap()]);
    assert!(
        err.contains("bad.conf:2: name is given twice: it takes one value"),
        "{err}"
    );
    assert!(!err.contains("admin"), "{err}");
    // A byte-order mark (Windows editors write one) is not part of the first option:
    // this file is refused for its second line, not its first.
    std::fs::write(&config, "\u{feff}listen tcp://127.0.0.1:0\nbogus 1\n").unwrap();
    let err = refused(&["--config", config.to_str().unwrap()]);
    assert!(
        err.contains("bad.conf:2: unknown option \"bogus\""),
        "{err}"
    );
    // A file an option names and the server cannot read is named with its option
    // (the TLS builder named the path alone).
    let missing = dir.join("missing.pem");
    let missing = missing.to_str().unwrap();
    for option in ["--tls-cert", "--tls-key"] {
        let (cert, key) = if option == "--tls-cert" {
            (missing, "/dev/null")
        } else {
            ("/dev/null", missing)
        };
        let (code, err) = refused_with(&[
            "--listen",
            "tls://127.0.0.1:0",
            "--tls-cert",
            cert,
            "--tls-key",
            key,
        ]);
        assert!(
            err.contains(&format!("{option} {missing}: cannot read it")),
            "{err}"
        );
        assert_eq!(code, 1, "a failure at run time: {err}");
    }
    // The etcd files are read and parsed before any listener serves (they were only
    // when registering, after "listening on").
    let empty = dir.join("empty");
    std::fs::write(&empty, "").unwrap();
    let empty = empty.to_str().unwrap();
    for (option, extra) in [
        (
            "--etcd-password-file",
            vec!["--etcd-user", "u", "--etcd-password-file", empty],
        ),
        ("--etcd-ca", vec!["--etcd-ca", empty]),
    ] {
        let mut args = vec![
            "--listen",
            "tcp://127.0.0.1:0",
            "--register",
            "etcd://127.0.0.1:1/svc",
            "--advertise",
            "tcp://127.0.0.1:1",
        ];
        args.extend(extra);
        let (code, out, err) = refused_outputs(&args);
        assert_eq!(code, 1, "{option}: {err}");
        assert!(err.contains(option), "{option} named: {err}");
        assert!(
            !out.contains("listening on"),
            "{option}: served first: {out}"
        );
    }
    // Written as on the command line: the name without `--` is suggested.
    std::fs::write(&config, "--listen tcp://127.0.0.1:0\n").unwrap();
    let err = refused(&["--config", config.to_str().unwrap()]);
    assert!(
        err.contains("write names without --: `listen tcp://127.0.0.1:0`"),
        "{err}"
    );
    // `-h` as a value is not the help switch: the server is named `-h` (and refused
    // here for its --ttl-s, after the name was read).
    let err = refused(&["--name", "-h", "--ttl-s", "0"]);
    assert!(err.contains("--ttl-s 0"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Registered with `--advertise auto`, a listener on every interface would put
/// `tcp://0.0.0.0:PORT` in etcd, sending each client to its own host (a multi-host
/// round found a client on a host with another server there answered by it). The
/// server refuses to start, before reaching etcd, and says what to give instead.
#[test]
fn a_wildcard_listener_is_not_advertised() {
    for listen in ["tcp://0.0.0.0:0", "udp://[::]:0"] {
        let err = refused(&["--listen", listen, "--register", "etcd://127.0.0.1:1/kv"]);
        assert!(err.contains("--advertise auto would register"), "{err}");
        // Port 0 was picked for this run: the advice is a fixed port, not that one
        // (which the next start would not listen on).
        assert!(err.contains("0.0.0.0:PORT --advertise"), "{err}");
        assert!(err.contains("://HOST:PORT"), "{err}");
    }
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("tcp://0.0.0.0:{port}");
    let err = refused(&["--listen", &listen, "--register", "etcd://127.0.0.1:1/kv"]);
    assert!(
        err.contains(&format!("--advertise tcp://HOST:{port}")),
        "{err}"
    );
}

/// An `--advertise` that is no one server's address clients can use (a service name,
/// port 0, a wildcard host) is refused before etcd is reached: registered, a service
/// name failed every client by etcd name (a review of address parsing).
#[test]
fn an_advertised_address_clients_cannot_use_is_refused() {
    for advertise in [
        "dns://kv.example.com:7000",
        "static://a:1,b:1",
        "tcp://10.0.0.5:0",
        "tcp://0.0.0.0:7000",
    ] {
        let err = refused(&[
            "--listen",
            "tcp://127.0.0.1:0",
            "--advertise",
            advertise,
            "--register",
            "etcd://127.0.0.1:1/kv",
        ]);
        assert!(err.contains("--advertise"), "{advertise}: {err}");
        assert!(
            !err.contains("etcd"),
            "{advertise}: reached etcd first: {err}"
        );
    }
    // A parse error names the option too.
    let err = refused(&["--listen", "tcp://127.0.0.1:0", "--advertise", "tcp://h"]);
    assert!(err.contains("--advertise tcp://h"), "{err}");
}

/// A loopback address registered (the default listener's) serves only clients on this
/// host: said in a warning, as the server goes on (here it then fails to reach etcd).
#[test]
fn a_loopback_advertised_address_is_warned_about() {
    let err = refused(&[
        "--listen",
        "tcp://127.0.0.1:0",
        "--register",
        "etcd://127.0.0.1:1/kv",
    ]);
    assert!(err.contains("registering a loopback address"), "{err}");
}

/// An operator's mistakes are refused, saying what is wrong (an operator's round):
/// TLS settings no listener uses (it served in the clear, silently), a tokens file with
/// no token (every call but health failed), a lease past what etcd takes (it panicked
/// after registering), a `--name` metadata cannot carry, a `--register` that does not
/// parse or is no etcd address, and an admin address in use (the error named no
/// address).
#[test]
fn an_operators_mistakes_are_refused_by_name() {
    let tls = |name: &str| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/tls")
            .join(name)
            .display()
            .to_string()
    };
    let (cert, key) = (tls("server.pem"), tls("server.key"));
    let err = refused(&[
        "--listen",
        "tcp://127.0.0.1:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ]);
    assert!(err.contains("no --listen is tls://"), "{err}");
    let empty = std::env::temp_dir().join(format!("rpc-server-empty-{}", std::process::id()));
    std::fs::write(&empty, "# not mounted yet\n\n").unwrap();
    let err = refused(&[
        "--listen",
        "tcp://127.0.0.1:0",
        "--auth-tokens",
        &empty.display().to_string(),
    ]);
    assert!(err.contains("holds no token"), "{err}");
    for ttl in ["0", "18446744073709551615"] {
        let err = refused(&["--listen", "tcp://127.0.0.1:0", "--ttl-s", ttl]);
        assert!(err.contains("--ttl-s"), "{ttl}: {err}");
    }
    // A name metadata cannot carry (it was left off every reply, silently).
    let err = refused(&["--listen", "tcp://127.0.0.1:0", "--name", "two\nlines"]);
    assert!(err.contains("--name \"two\\nlines\""), "{err}");
    // --register's errors name it (one was a bare parse error), before any listener
    // binds (none announced on stdout).
    for register in ["etcd://", "tcp://127.0.0.1:7000"] {
        let output = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
            .args(["--listen", "tcp://127.0.0.1:0", "--register", register])
            .output()
            .expect("run rpc-server");
        assert!(!output.status.success(), "{register} was accepted");
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(err.contains(&format!("--register {register}")), "{err}");
        assert!(output.stdout.is_empty(), "a listener bound: {output:?}");
    }
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = busy.local_addr().unwrap().to_string();
    let err = refused(&["--listen", "tcp://127.0.0.1:0", "--admin", &at]);
    assert!(err.contains(&format!("--admin {at}")), "{err}");
}

/// With `--log json`, every line on stderr is a JSON object, the fatal error that stops
/// the server and the warning about a `RUST_LOG` it cannot read included (from a
/// review: both were plain text); `RUST_LOG` takes per-crate directives and `off`,
/// and the fatal error is written whatever it filters (from a review: `off` and a
/// misspelt level, read as a target, dropped it). A misspelt level, a crate named
/// with a hyphen and a span filter are warned about, logging at INFO.
#[test]
fn json_logs_are_json_to_the_last_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = format!("tcp://{}", taken.local_addr().unwrap());
    for (rust_log, lines) in [
        ("bogus=a=b", 2),
        ("rpc_core=warn,info", 1),
        ("off", 1),
        ("warning", 2),
        ("verbose", 2),
        ("rpc-server=debug", 2),
        ("rpc_core[conn]=debug", 2),
        // No directive at all (how spaces and empty directives are read:
        // `log_directives`' unit test).
        (",", 2),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
            .args(["--listen", &listen, "--log", "json"])
            .env("RUST_LOG", rust_log)
            .output()
            .expect("run rpc-server");
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        // (The JSON itself is tracing-subscriber's; one object per line.)
        let parsed: Vec<&str> = stderr.lines().collect();
        for line in &parsed {
            assert!(
                line.starts_with("{\"timestamp\":") && line.ends_with('}'),
                "not a JSON line: {line}"
            );
        }
        assert_eq!(parsed.len(), lines, "RUST_LOG={rust_log}: {stderr}");
        if lines == 2 {
            assert!(parsed[0].contains("logging at INFO"), "{stderr}");
        }
        let last = parsed.last().expect("the fatal error");
        assert!(last.contains("\"level\":\"ERROR\""), "{stderr}");
        assert!(last.contains("Address already in use"), "{stderr}");
    }
    // An error in the arguments themselves, before the logger is installed, with
    // `--log json`, `--log=json`, or `log json` in the config file.
    let dir = std::env::temp_dir().join(format!("rpc-server-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("json.conf");
    std::fs::write(
        &config,
        "log json
bogus 1
",
    )
    .unwrap();
    for args in [
        vec!["--log", "json", "--lisen", "tcp://127.0.0.1:0"],
        vec!["--log=json", "--lisen", "tcp://127.0.0.1:0"],
        vec!["--config", config.to_str().unwrap()],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_rpc-server"))
            .args(&args)
            .output()
            .expect("run rpc-server");
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with("{\"timestamp\":")
                && (stderr.contains("--lisen") || stderr.contains("bogus")),
            "{args:?}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
