//! The coordinator: the static table of slots (equal ranges of the key
//! hash space), which master incarnation serves each, and the live
//! backups. One process, state in memory, no consensus: it is the one
//! part of the store that is not replicated (docs/kv.md).

use crate::proto::{backup, coord, EnlistMaster, Grant, Ready, Table};
use homa_rpc::{Code, Context, Status};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

/// How long the coordinator waits for a suspected backup's ping.
pub const PING_TIMEOUT: Duration = Duration::from_millis(150);

#[derive(Debug)]
struct State {
    table: Table,
    /// The newest incarnation granted per slot (0: never).
    epochs: Vec<u64>,
}

/// The coordinator service.
pub struct Coordinator {
    state: Mutex<State>,
}

impl Coordinator {
    /// A coordinator of `slots` slots, none served yet.
    pub fn new(slots: u32) -> Coordinator {
        let slots = slots.max(1) as usize;
        Coordinator {
            state: Mutex::new(State {
                table: Table {
                    version: 1,
                    masters: vec![None; slots],
                    backups: Vec::new(),
                },
                epochs: vec![0; slots],
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The table now.
    pub fn table(&self) -> Table {
        self.state().table.clone()
    }
}

impl coord::Service for Coordinator {
    fn enlist_backup(&self, _cx: &Context, addr: SocketAddr) -> Result<(), Status> {
        let mut s = self.state();
        if !s.table.backups.contains(&addr) {
            s.table.backups.push(addr);
            s.table.version += 1;
        }
        Ok(())
    }

    fn enlist_master(&self, _cx: &Context, m: EnlistMaster) -> Result<Grant, Status> {
        let mut s = self.state();
        let slots = s.epochs.len() as u32;
        let slot = match m.slot {
            Some(i) if i < slots => i,
            Some(i) => {
                return Err(Status::new(
                    Code::OutOfRange,
                    format!("slot {i} of {slots}"),
                ))
            }
            None => s
                .epochs
                .iter()
                .position(|&e| e == 0)
                .ok_or_else(|| Status::new(Code::AlreadyExists, "every slot has a master"))?
                as u32,
        };
        // A new incarnation: the old one (if any) stops being served
        // until the new one has recovered.
        let epoch = s.epochs.iter().copied().max().unwrap_or(0) + 1;
        s.epochs[slot as usize] = epoch;
        s.table.masters[slot as usize] = None;
        s.table.version += 1;
        Ok(Grant { slot, epoch, slots })
    }

    fn master_ready(&self, _cx: &Context, r: Ready) -> Result<(), Status> {
        let mut s = self.state();
        let i = r.slot as usize;
        if s.epochs.get(i) != Some(&r.epoch) {
            return Err(Status::new(
                Code::Aborted,
                "a newer incarnation took the slot",
            ));
        }
        s.table.masters[i] = Some(r.addr);
        s.table.version += 1;
        Ok(())
    }

    fn table(&self, _cx: &Context, _: ()) -> Result<Table, Status> {
        Ok(self.table())
    }

    fn suspect(&self, cx: &Context, addr: SocketAddr) -> Result<bool, Status> {
        let rpc = cx.client()?.with_timeout(PING_TIMEOUT);
        let alive = (0..2).any(|_| backup::Client::new(rpc.clone(), addr).ping(&()).is_ok());
        if alive {
            return Ok(false);
        }
        let mut s = self.state();
        s.table.backups.retain(|a| *a != addr);
        s.table.version += 1;
        Ok(true)
    }
}
