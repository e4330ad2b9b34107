//! The images: the chart's default image is the one this version builds, the Dockerfile and
//! testbed/build-image.sh build the same image, and testbed/oci_image.py writes an archive a
//! container runtime can load (index -> manifest -> config -> layer, every digest right).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> serde_yaml::Value {
    serde_yaml::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_charts_default_image_is_the_one_this_version_builds() {
    let chart = yaml("charts/modelserve/Chart.yaml");
    let values = yaml("charts/modelserve/values.yaml");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(version),
        "Chart.yaml appVersion must be the Cargo version, the tag build-image.sh gives the image"
    );
    assert_eq!(
        values["image"]["tag"].as_str(),
        Some(""),
        "values.yaml image.tag must stay empty (the appVersion), or it drifts from the image built"
    );
    let (repo, tag) = modelserve::pipeline::env::DEFAULT_PULL_IMAGE
        .rsplit_once(':')
        .unwrap();
    assert_eq!(values["image"]["repository"].as_str(), Some(repo));
    assert_eq!(tag, version);
    let script = read("testbed/build-image.sh");
    assert!(
        script.contains(&format!("--name \"{repo}:$version\"")),
        "build-image.sh names the image {repo}:<Cargo version>"
    );
}

/// The instruction lines of the Dockerfile's final stage.
fn final_stage(dockerfile: &str) -> Vec<String> {
    let joined = dockerfile.replace("\\\n", " ");
    let lines: Vec<&str> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let start = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    lines[start..].iter().map(|l| l.to_string()).collect()
}

#[test]
fn the_dockerfile_and_build_image_sh_build_the_same_image() {
    let stage = final_stage(&read("Dockerfile"));
    assert_eq!(stage[0], "FROM scratch", "the final stage has no base");
    let script = read("testbed/build-image.sh");
    let want = [
        ("USER 65532:65532", "--user 65532:65532"),
        (
            "ENTRYPOINT [\"/usr/local/bin/modelserve\"]",
            "--entrypoint /usr/local/bin/modelserve",
        ),
        ("ENV PATH=/usr/local/bin", "--env PATH=/usr/local/bin"),
    ];
    for (docker, ours) in want {
        assert!(
            stage.iter().any(|l| l == docker),
            "Dockerfile lacks {docker:?}: {stage:?}"
        );
        assert!(script.contains(ours), "build-image.sh lacks {ours:?}");
    }
    // The build stage's Rust is one this crate builds with.
    let docker = read("Dockerfile");
    let rust: Vec<u32> = docker
        .split("rust:")
        .nth(1)
        .and_then(|r| r.split('-').next())
        .unwrap()
        .split('.')
        .map(|n| n.parse().unwrap())
        .collect();
    let needed: Vec<u32> = env!("CARGO_PKG_RUST_VERSION")
        .split('.')
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        rust >= needed,
        "Dockerfile's rust:{rust:?} is older than rust-version {needed:?}"
    );
    // The pods the operator generates and the chart run as the image's user.
    for template in ["deployment.yaml", "mirror.yaml"] {
        let t = read(&format!("charts/modelserve/templates/{template}"));
        assert!(
            t.contains("runAsUser: 65532"),
            "{template} runs as another user"
        );
    }
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn blob(dir: &Path, desc: &Value) -> Vec<u8> {
    let digest = desc["digest"].as_str().unwrap();
    let bytes = std::fs::read(
        dir.join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:")),
    )
    .unwrap_or_else(|e| panic!("blob {digest}: {e}"));
    assert_eq!(sha256(&bytes), digest, "a blob's name is its digest");
    assert_eq!(desc["size"].as_u64(), Some(bytes.len() as u64));
    bytes
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn write_image(dir: &Path, name: &str) -> PathBuf {
    let bin = dir.join("tool");
    std::fs::write(&bin, b"#!/bin/true\n").unwrap();
    let archive = dir.join(format!("{name}.tar"));
    run(Command::new("python3")
        .arg(root().join("testbed/oci_image.py"))
        .args(["--out", archive.to_str().unwrap(), "--name"])
        .arg(format!("localhost/test/{name}:server-b11312"))
        .args(["--user", "65532:65532", "--entrypoint", "/app/tool"])
        .args(["--env", "A=1", "--label", "k=v", "--dir", "/tmp"])
        .arg(format!("{}=/app/tool:0755", bin.display())));
    archive
}

#[test]
fn oci_image_py_writes_an_archive_a_runtime_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let archive = write_image(tmp.path(), "one");
    let dir = tmp.path().join("x");
    std::fs::create_dir(&dir).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&dir));
    let layout: Value =
        serde_json::from_slice(&std::fs::read(dir.join("oci-layout")).unwrap()).unwrap();
    assert_eq!(layout["imageLayoutVersion"], "1.0.0");
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let entry = &index["manifests"][0];
    let name = "localhost/test/one:server-b11312";
    assert_eq!(entry["annotations"]["io.containerd.image.name"], name);
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        name
    );
    assert_eq!(modelserve::gguf::support::build_of_image(name), Some(11312));

    let manifest: Value = serde_json::from_slice(&blob(&dir, entry)).unwrap();
    let config: Value = serde_json::from_slice(&blob(&dir, &manifest["config"])).unwrap();
    assert_eq!(config["os"], "linux");
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/app/tool"])
    );
    assert_eq!(config["config"]["Env"], serde_json::json!(["A=1"]));
    assert_eq!(config["config"]["Labels"]["k"], "v");

    // The layer: gzip of a tar whose digest is the config's diff_id, holding the file at its
    // path and mode, owned by root, with /tmp sticky.
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let packed = tmp.path().join("layer.tar.gz");
    std::fs::write(&packed, blob(&dir, &layers[0])).unwrap();
    let raw = run(Command::new("gzip").arg("-dc").arg(&packed)).stdout;
    assert_eq!(
        config["rootfs"]["diff_ids"][0].as_str(),
        Some(sha256(&raw).as_str())
    );
    std::fs::write(tmp.path().join("layer.tar"), &raw).unwrap();
    let listing = String::from_utf8(
        run(Command::new("tar")
            .args(["-tvf"])
            .arg(tmp.path().join("layer.tar"))
            .args(["--numeric-owner"]))
        .stdout,
    )
    .unwrap();
    let line = |path: &str| {
        listing
            .lines()
            .find(|l| l.split_whitespace().last() == Some(path))
            .unwrap_or_else(|| panic!("{path} not in the layer:\n{listing}"))
            .to_string()
    };
    assert!(line("app/tool").starts_with("-rwxr-xr-x 0/0"), "{listing}");
    assert!(line("app/").starts_with("drwxr-xr-x 0/0"), "{listing}");
    assert!(line("tmp/").starts_with("drwxrwxrwt 0/0"), "{listing}");

    // The same files give the same image: the archive is reproducible.
    let again = write_image(tmp.path(), "two");
    let digest = |p: &Path| {
        let d = tmp
            .path()
            .join(format!("d-{}", p.file_stem().unwrap().to_string_lossy()));
        std::fs::create_dir(&d).unwrap();
        run(Command::new("tar").arg("-xf").arg(p).arg("-C").arg(&d));
        let i: Value =
            serde_json::from_slice(&std::fs::read(d.join("index.json")).unwrap()).unwrap();
        i["manifests"][0]["digest"].as_str().unwrap().to_string()
    };
    assert_eq!(digest(&archive), digest(&again));
}

#[test]
fn oci_image_py_rejects_a_bad_name_or_path_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("tool");
    std::fs::write(&bin, b"x").unwrap();
    let out = tmp.path().join("i.tar");
    let attempt = |name: &str, spec: String| {
        Command::new("python3")
            .arg(root().join("testbed/oci_image.py"))
            .args(["--out", out.to_str().unwrap(), "--name", name])
            .arg(spec)
            .output()
            .unwrap()
    };
    let relative = attempt("a/b:c", format!("{}=app/tool", bin.display()));
    assert!(!relative.status.success());
    assert!(String::from_utf8_lossy(&relative.stderr).contains("must be an absolute path"));
    let untagged = attempt("a/b", format!("{}=/app/tool", bin.display()));
    assert!(!untagged.status.success());
    assert!(String::from_utf8_lossy(&untagged.stderr).contains("want REPOSITORY:TAG"));
    assert!(!out.exists(), "no archive is left from a refused run");
}
