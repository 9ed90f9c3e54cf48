//! Ticket lines: parsed or refused with a reason; what parses prints back
//! to a line that parses to the same ticket.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_protocol::ticket::Ticket;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(ticket) = line.parse::<Ticket>() {
        let again: Ticket = ticket.to_string().parse().expect("a printed ticket parses");
        assert_eq!(again, ticket);
    }
});
