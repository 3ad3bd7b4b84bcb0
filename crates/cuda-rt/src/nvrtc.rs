//! Raw NVRTC: loading `libnvrtc.so.13` from the toolkit, and compiling one source with its in-memory
//! headers to a cubin (cudarc's safe NVRTC API stops at PTX and takes no headers, so this is on `sys`).

use std::ffi::{CStr, CString, c_char};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::result::NvrtcError;
use cudarc::nvrtc::sys;

use crate::error::DriverCall;
use crate::{Arch, Error, Header, Result, Toolkit, toolkit::NVRTC_SONAME};

/// The NVRTC library in use: what goes into cache keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NvrtcVersion {
    pub major: i32,
    pub minor: i32,
    /// Size of `libnvrtc.so.13`: tells apart patch releases, which share `major.minor`.
    pub lib_bytes: u64,
}

/// Makes cudarc's NVRTC bindings usable with `toolkit`'s library and returns its version.
///
/// cudarc `dlopen`s `libnvrtc.so.13` by bare name, and libnvrtc in turn `dlopen`s
/// `libnvrtc-builtins.so.13.x` by bare name; both would need `LD_LIBRARY_PATH`. Loading both by absolute
/// path first makes those later lookups resolve to the loaded copies (glibc matches the SONAME), so no
/// environment is needed. One NVRTC per process: a later call naming another toolkit gets the first.
pub(crate) fn load(toolkit: &Toolkit) -> Result<NvrtcVersion> {
    static LOADED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let lib_dir = toolkit.lib_dir();
    match LOADED.get_or_init(|| preload(lib_dir).map(|()| lib_dir.to_path_buf())) {
        Ok(first) if first != lib_dir => tracing::warn!(
            loaded = %first.display(),
            requested = %lib_dir.display(),
            "NVRTC is already loaded from another toolkit; using that one"
        ),
        Ok(_) => {}
        Err(reason) => {
            return Err(Error::NvrtcNotFound {
                lib_dir: lib_dir.to_path_buf(),
                reason: reason.clone(),
            });
        }
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: preload() checked that cudarc finds the library; out-pointers are valid.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .call("nvrtcVersion")?;
    let lib_bytes = std::fs::metadata(lib_dir.join(NVRTC_SONAME)).map_or(0, |m| m.len());
    Ok(NvrtcVersion {
        major,
        minor,
        lib_bytes,
    })
}

fn preload(lib_dir: &Path) -> std::result::Result<(), String> {
    let builtins = std::fs::read_dir(lib_dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.starts_with("libnvrtc-builtins.so.") && !n.contains(".alt."))
        .min_by_key(|n| n.len())
        .ok_or("no libnvrtc-builtins.so.* next to it")?;
    for name in [builtins.as_str(), NVRTC_SONAME] {
        let path = lib_dir.join(name);
        // SAFETY: NVIDIA's libraries run no initialisers with preconditions.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| e.to_string())?;
        // Kept loaded for the life of the process, as cudarc keeps its own handle.
        std::mem::forget(lib);
    }
    // SAFETY: only probes dlopen.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(format!("loaded, but cudarc does not find {NVRTC_SONAME}"))
    }
}

/// A successful compile: the cubin and the whole program log (ptxas `-v` report included).
pub(crate) struct Output {
    pub cubin: Vec<u8>,
    pub log: String,
}

/// Destroys the program on every exit path.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram, destroyed once.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    fn log(&self) -> Result<String> {
        let mut size = 0usize;
        // SAFETY: valid program and out-pointer; the buffer has the size NVRTC reported.
        let bytes = unsafe {
            sys::nvrtcGetProgramLogSize(self.0, &mut size)
                .result()
                .call("nvrtcGetProgramLogSize")?;
            let mut buf = vec![0u8; size.max(1)];
            sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr().cast())
                .result()
                .call("nvrtcGetProgramLog")?;
            buf
        };
        let text = CStr::from_bytes_until_nul(&bytes).map_or_else(
            |_| String::from_utf8_lossy(&bytes).into_owned(),
            |c| c.to_string_lossy().into_owned(),
        );
        Ok(text)
    }

    fn cubin(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: as in log().
        unsafe {
            sys::nvrtcGetCUBINSize(self.0, &mut size)
                .result()
                .call("nvrtcGetCUBINSize")?;
            let mut buf = vec![0u8; size];
            sys::nvrtcGetCUBIN(self.0, buf.as_mut_ptr().cast())
                .result()
                .call("nvrtcGetCUBIN")?;
            Ok(buf)
        }
    }
}

/// Compiles kernel `kernel`'s translation unit `source` with `headers` for `arch`, with the full option
/// list `options`. [`load`] must have succeeded.
pub(crate) fn compile(
    kernel: &str,
    arch: Arch,
    source: Header,
    headers: &[Header],
    options: &[String],
) -> Result<Output> {
    let c = |what: &str, s: &str| {
        CString::new(s).map_err(|_| Error::InvalidSpec {
            kernel: kernel.to_owned(),
            reason: format!("{what} contains a NUL byte"),
        })
    };
    let name = c("the source name", source.0)?;
    let source = c("the source", source.1)?;
    let header_names = headers
        .iter()
        .map(|h| c("a header name", h.0))
        .collect::<Result<Vec<_>>>()?;
    let header_texts = headers
        .iter()
        .map(|h| c(&format!("header {}", h.0), h.1))
        .collect::<Result<Vec<_>>>()?;
    let options = options
        .iter()
        .map(|o| c("an option", o))
        .collect::<Result<Vec<_>>>()?;
    let ptrs = |v: &[CString]| v.iter().map(|s| s.as_ptr()).collect::<Vec<*const c_char>>();
    let (header_names, header_texts, options) =
        (ptrs(&header_names), ptrs(&header_texts), ptrs(&options));

    let mut program = Program(std::ptr::null_mut());
    // SAFETY: every pointer refers to a live NUL-terminated string; the arrays have the stated lengths.
    unsafe {
        sys::nvrtcCreateProgram(
            &mut program.0,
            source.as_ptr(),
            name.as_ptr(),
            header_texts.len() as i32,
            header_texts.as_ptr(),
            header_names.as_ptr(),
        )
        .result()
        .call("nvrtcCreateProgram")?;
    }
    // SAFETY: valid program; `options` outlives the call.
    let status =
        unsafe { sys::nvrtcCompileProgram(program.0, options.len() as i32, options.as_ptr()) };
    let log = program.log()?;
    match status {
        sys::nvrtcResult::NVRTC_SUCCESS => Ok(Output {
            cubin: program.cubin()?,
            log,
        }),
        // Invalid options are reported in the log too; keep it whenever there is one.
        _ if !log.trim().is_empty() => Err(Error::Compile {
            kernel: kernel.to_owned(),
            arch,
            log,
        }),
        other => Err(Error::Nvrtc {
            call: "nvrtcCompileProgram",
            source: NvrtcError(other),
        }),
    }
}
