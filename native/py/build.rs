//! Cythonize `cython/*.pyx` into OUT_DIR and compile the C into this cdylib, so that one
//! `pip install .` (maturin) builds both native parts. The module's PEP 489 init runs at import
//! time from `src/cython.rs`.
use pyo3_build_config::PythonAbiKind;
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// (file stem in cython/, fully qualified module name)
const MODULES: &[(&str, &str)] = &[("wire", "sie_sidecar._native.wire")];

fn main() {
    let cfg = pyo3_build_config::get();
    pyo3_build_config::use_pyo3_cfgs();
    assert!(
        matches!(cfg.target_abi().kind(), PythonAbiKind::VersionSpecific(_)),
        "sie-sidecar's Cython part uses the full C API: build a version-specific wheel, not abi3"
    );
    assert!(
        !cfg.target_abi().kind().is_free_threaded(),
        "free-threaded CPython is not supported: the Cython part is not audited for it"
    );

    // The interpreter that runs Cython (the build host's, with Cython installed): SIE_BUILD_PYTHON,
    // else PYO3_PYTHON, else python3.
    let python = env::var("SIE_BUILD_PYTHON")
        .or_else(|_| env::var("PYO3_PYTHON"))
        .unwrap_or_else(|_| "python3".to_owned());
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let cython_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"))
        .join("../../cython");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    println!("cargo:rerun-if-env-changed=SIE_BUILD_PYTHON");
    println!("cargo:rerun-if-env-changed=SIE_PYTHON_INCLUDE");
    for entry in std::fs::read_dir(&cython_dir).expect("cython/ directory") {
        let path = entry.expect("dir entry").path();
        println!("cargo:rerun-if-changed={}", path.display());
    }

    // The C is compiled against the *target* CPython's headers. For a native build they are the
    // interpreter's own; a cross or other-version build names them in SIE_PYTHON_INCLUDE (a
    // path list: Debian's pyconfig.h wrapper also needs the directory above its multiarch one).
    let includes: Vec<PathBuf> = match env::var_os("SIE_PYTHON_INCLUDE") {
        Some(list) => env::split_paths(&list).collect(),
        None => vec![PathBuf::from(python_stdout(
            &python,
            "import sysconfig; print(sysconfig.get_path('include'), end='')",
        ))],
    };
    let target = cfg.version();
    check_header_version(&includes, target.major, target.minor);

    let mut build = cc::Build::new();
    for dir in &includes {
        build.include(dir);
    }
    build
        .include(&cython_dir)
        .flag_if_supported("-fno-strict-aliasing")
        .flag_if_supported("-fvisibility=hidden")
        .flag_if_supported(format!("-fmacro-prefix-map={}=.", out.display()))
        .opt_level(2)
        .warnings(false);

    for (stem, qualname) in MODULES {
        let c_file = out.join(format!("{stem}.c"));
        cythonize(&python, &cython_dir, stem, qualname, &c_file);
        build.file(&c_file);
    }
    build.compile("sie_cython");
}

fn cythonize(python: &str, cython_dir: &Path, stem: &str, qualname: &str, c_file: &Path) {
    let status = Command::new(python)
        .args([
            "-m",
            "cython",
            "-3",
            "--fast-fail",
            "--module-name",
            qualname,
            "-I",
        ])
        .arg(cython_dir)
        .arg("-o")
        .arg(c_file)
        .arg(cython_dir.join(format!("{stem}.pyx")))
        .status()
        .expect("failed to run `python -m cython` (is cython in build-system.requires?)");
    assert!(status.success(), "cython failed on {stem}.pyx");
}

/// Refuse headers of another CPython than the one PyO3 targets: the wheel would import and then
/// misbehave (struct layouts differ between minor versions), so fail the build instead.
fn check_header_version(includes: &[PathBuf], major: u8, minor: u8) {
    let Some(text) = includes
        .iter()
        .find_map(|dir| std::fs::read_to_string(dir.join("patchlevel.h")).ok())
    else {
        panic!("no patchlevel.h in {includes:?}: set SIE_PYTHON_INCLUDE to the target CPython's include directory");
    };
    let field = |name: &str| -> Option<u8> {
        text.lines()
            .find_map(|line| line.strip_prefix("#define ")?.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
    };
    let found = (field("PY_MAJOR_VERSION"), field("PY_MINOR_VERSION"));
    assert!(
        found == (Some(major), Some(minor)),
        "CPython headers in {includes:?} are {found:?}, but the build targets {major}.{minor}: \
         set SIE_PYTHON_INCLUDE to that version's include directory"
    );
}

fn python_stdout(python: &str, code: &str) -> String {
    let out = Command::new(python)
        .args(["-c", code])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 path")
}
