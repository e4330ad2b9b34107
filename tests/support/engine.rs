//! The real llama-server of the test bed, run by the memory tests: started on a free loopback
//! port with its log in a file, waited for until it answers, and killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running llama-server.
pub struct Server {
    pub child: Child,
    pub url: String,
    pub log: PathBuf,
}

impl Drop for Server {
    /// Kills it, and removes its log unless a test failed (then the log stays, named on
    /// stderr): a full run starts about 300 servers.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        super::drop_log(&self.log);
    }
}

impl Server {
    /// Starts `server` on `model` with `args` besides the model, the address and `-lv 4` (the
    /// verbosity that logs every buffer).
    pub fn start(server: &Path, model: &Path, args: &[String]) -> Server {
        Server::start_with(server, model, args, &[])
    }

    /// [`Server::start`] with `env` set in its environment.
    pub fn start_with(
        server: &Path,
        model: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Server {
        let port = super::free_port();
        let log = std::env::temp_dir().join(format!("llama-server-{port}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(server)
            .arg("--model")
            .arg(model)
            .args(args)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "-lv",
                "4",
            ])
            .envs(env.iter().copied())
            .stdout(file.try_clone().unwrap())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("start llama-server");
        Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    /// Waits until /health answers (the model is loaded and every buffer logged).
    pub async fn ready(&mut self, http: &reqwest::Client) {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if let Ok(r) = http.get(format!("{}/health", self.url)).send().await
                && r.status().is_success()
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("llama-server exited ({status}): {}", self.log_text());
            }
            assert!(Instant::now() < deadline, "llama-server not ready in 300 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What it has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// MiB figures llama-server printed after `marker`, summed over its lines.
pub fn logged(log: &str, marker: &str) -> f64 {
    log.lines()
        .filter_map(|l| l.split_once(marker))
        .filter_map(|(_, rest)| rest.split_whitespace().next()?.parse::<f64>().ok())
        // From 0.0: an empty f64 sum is -0.0, which prints as "-0.00".
        .fold(0.0, |a, b| a + b)
}

/// POSTs `body` as JSON to `url` (600 s at most) and returns the JSON answer; panics on an error
/// status.
pub async fn post(
    http: &reqwest::Client,
    url: String,
    body: serde_json::Value,
) -> serde_json::Value {
    let r = http
        .post(&url)
        .json(&body)
        .timeout(Duration::from_secs(600))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    assert!(r.status().is_success(), "{url}: {}", r.status());
    r.json().await.unwrap()
}

/// The server's tokens of a made-up inventory of `items` lines, a prompt of any length.
pub async fn inventory_tokens(
    s: &Server,
    http: &reqwest::Client,
    items: usize,
) -> Vec<serde_json::Value> {
    let text = (0..items)
        .map(|i| format!("item {i} of the inventory, checked and counted."))
        .collect::<Vec<_>>()
        .join(" ");
    post(
        http,
        format!("{}/tokenize", s.url),
        serde_json::json!({ "content": text }),
    )
    .await["tokens"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Every slot busy at once with its own prompt that fills its context (`ctx / parallel` cells,
/// but for the few tokens it then generates), so every host buffer is touched as far as full
/// slots touch it: the KV cache's pages, and the compute buffers' attention masks, which grow
/// with the cells in use. A model that keeps context checkpoints makes its two as such a prompt
/// passes the window. Asserts the engine read each prompt whole.
pub async fn fill_every_slot(s: &Server, http: &reqwest::Client, ctx: u64, parallel: u64) {
    const PREDICT: u64 = 4;
    let want = usize::try_from(ctx / parallel - PREDICT - 4).unwrap();
    let slots = usize::try_from(parallel).unwrap();
    // Text of enough tokens for each slot's own prompt, starting apart: tokens per item differ
    // by vocabulary (a byte-level one takes several times as many).
    let mut items = want / 4;
    let tokens = loop {
        let tokens = inventory_tokens(s, http, items).await;
        if tokens.len() >= want + 8 * slots {
            break tokens;
        }
        assert!(items < 1 << 16, "{} tokens of {items} items", tokens.len());
        items *= 2;
    };
    let one = |i: usize| {
        post(
            http,
            format!("{}/completion", s.url),
            serde_json::json!({ "prompt": &tokens[8 * i..8 * i + want], "n_predict": PREDICT }),
        )
    };
    let done = futures::future::join_all((0..slots).map(one)).await;
    for d in done {
        let prompt = d["timings"]["prompt_n"].as_u64().unwrap_or(0);
        assert_eq!(prompt as usize, want, "the whole prompt read: {d}");
    }
}
