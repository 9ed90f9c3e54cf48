//! A step's command: Blender or ffmpeg itself, or a shell script running
//! one of them, split into words as a shell would.

use super::*;

/// The programs a step may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Program {
    Blender,
    Ffmpeg,
}

/// The program a step runs, its arguments, and the field they came from:
/// its command is Blender or ffmpeg, or a shell running an embedded script
/// whose one command is one of them.
pub(super) fn step_command(
    at: &str,
    command: &str,
    args: &[String],
    files: &HashMap<String, String>,
    scope: &Scope<'_>,
) -> Result<(Program, String, Vec<String>), String> {
    let field = format!("{at}.script.actions.onRun");
    if let Some(p) = known(command) {
        return Ok((p, format!("{field}.args"), args.to_vec()));
    }
    let shell = matches!(program(command), "bash" | "sh" | "zsh" | "dash");
    let script_file: Option<String> = if shell {
        args.first().cloned()
    } else {
        Some(command.to_string()).filter(|c| c.starts_with("\u{0}FILE:"))
    };
    let Some(file) = script_file
        .as_deref()
        .and_then(|a| a.strip_prefix("\u{0}FILE:"))
        .and_then(|a| a.strip_suffix('\u{0}'))
    else {
        return Err(format!(
            "{field}.command: `{command}` is not Blender or ffmpeg; Tessera runs Blender and ffmpeg steps only"
        ));
    };
    let field = format!("{at}.script.embeddedFiles ({file})");
    let data = scope.resolve(&files[file], &field)?;
    let mut command = None;
    for line in logical_lines(&data) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words = shell_words(line).map_err(|e| format!("{field}: `{line}`: {e}"))?;
        match words.first().map(|w| (program(w), known(w))) {
            Some(("set" | "mkdir" | "echo", _)) => continue,
            Some((_, Some(p))) => {
                if command.is_some() {
                    return Err(format!(
                        "{field}: runs two commands; make each a step of its own"
                    ));
                }
                command = Some((p, words[1..].to_vec()));
            }
            _ => {
                return Err(format!(
                    "{field}: `{line}` is not a Blender or ffmpeg command; Tessera runs Blender and ffmpeg steps only"
                ))
            }
        }
    }
    let (p, args) = command.ok_or_else(|| format!("{field}: runs no Blender or ffmpeg"))?;
    Ok((p, field, args))
}

/// The program `command` names, if it is one a step may run.
fn known(command: &str) -> Option<Program> {
    let p = program(command).to_ascii_lowercase();
    if is_blender(command) {
        Some(Program::Blender)
    } else if p == "ffmpeg" || p == "ffmpeg.exe" {
        Some(Program::Ffmpeg)
    } else {
        None
    }
}

pub(super) fn program(command: &str) -> &str {
    command.rsplit(['/', '\\']).next().unwrap_or(command)
}

pub(super) fn is_blender(command: &str) -> bool {
    let p = program(command).to_ascii_lowercase();
    p == "blender" || p == "blender.exe" || p.starts_with("blender-")
}

/// Lines with backslash-newline continuations joined.
pub(super) fn logical_lines(data: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in data.lines() {
        match line.strip_suffix('\\') {
            Some(start) => {
                cur.push_str(start);
                cur.push(' ');
            }
            None => {
                cur.push_str(line);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Splits a shell line into words as a POSIX shell reads its quotes and
/// backslashes (shlex); refuses what only a shell could evaluate.
pub(super) fn shell_words(line: &str) -> Result<Vec<String>, String> {
    refuse_shell_syntax(line)?;
    shlex::split(line).ok_or_else(|| "an unclosed quote".to_string())
}

/// What a plain command line has not: expansions (`$`, backquotes) outside
/// single quotes, and outside any quotes `;|&<>()`, which make it more than
/// one command. A comment (`#` starting a word) ends the line.
pub(super) fn refuse_shell_syntax(line: &str) -> Result<(), String> {
    let (mut single, mut double, mut escaped) = (false, false, false);
    let mut word_start = true;
    for c in line.chars() {
        let at_word_start = std::mem::replace(&mut word_start, matches!(c, ' ' | '\t'));
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' if !single => escaped = true,
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && at_word_start => return Ok(()),
            '$' | '`' if !single => return Err("shell expansion cannot be mapped".into()),
            ';' | '|' | '&' | '>' | '<' | '(' | ')' if !single && !double => {
                return Err(format!("`{c}`: only one plain command can be mapped"))
            }
            _ => {}
        }
    }
    Ok(())
}
