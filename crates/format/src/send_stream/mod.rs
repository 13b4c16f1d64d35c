//! The btrfs send stream (what `btrfs send` writes and `btrfs receive` reads), protocol
//! versions 1 to 3.
//!
//! A stream is a 17-byte header (`btrfs-stream\0`, version u32) and commands: length u32,
//! command u16, crc32c u32 (the kernel's: seed 0, no inversion, over the header with the crc
//! field zeroed and the payload), then attributes as type u16, length u16, value. From v2
//! on, the `DATA` attribute has no length: it takes the rest of its command.
//!
//! [`StreamReader`] reads one [`Command`] at a time and refuses, with the byte offset and
//! the command, anything wrong: truncation, a bad crc, unknown numbers, missing, repeated or
//! misfit attributes, and paths that could leave the subvolume ([`check_path`]).
//! [`StreamWriter`] writes commands back, in the kernel's attribute order.
//!
//! ```
//! use oleo_format::send_stream::{Command, StreamReader, StreamWriter};
//!
//! let mut w = StreamWriter::new(Vec::new(), 2)?;
//! w.write_command(&Command::Mkdir { path: b"dir".to_vec(), ino: 257 })?;
//! w.write_command(&Command::End)?;
//! let bytes = w.into_inner();
//!
//! let mut r = StreamReader::new(&bytes[..]).unwrap();
//! assert_eq!(r.next_command().unwrap(), Some(Command::Mkdir { path: b"dir".to_vec(), ino: 257 }));
//! assert_eq!(r.next_command().unwrap(), Some(Command::End));
//! assert_eq!(r.next_command().unwrap(), None);
//! # Ok::<(), std::io::Error>(())
//! ```

mod command;
mod decode;
mod encode;

#[cfg(test)]
mod tests;

pub use command::{
    attr, attribute_name, cmd, command_name, crc32c_raw, max_attribute, max_command, Command,
    Timespec, CMD_HEADER_SIZE, MAX_COMMAND_LEN, MAX_VERSION, STREAM_HEADER_SIZE, STREAM_MAGIC,
    TIMESPEC_SIZE, TLV_HEADER_SIZE,
};
pub use decode::{check_path, CommandRef, StreamError, StreamErrorKind, StreamReader};
pub use encode::StreamWriter;
