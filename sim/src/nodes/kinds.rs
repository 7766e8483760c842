//! Which of the fault kinds added to the scenario after its first seeds were kept a run
//! draws (from `Settings`: `bit_flips`, `damage`, `lagging_io`, `commands`, `overlaps`,
//! `lost_log`, `doubled`, `change_faults`, `slow_leader`).
//! Each one off, a seed draws and does what it did before the kind existed here.

/// The newer kinds a run has.
#[derive(Clone, Copy, Debug, Default)]
pub struct Kinds {
    /// A member restarts on one flipped bit of its Raft log or a WAL segment
    /// (`disk_faults::flip`).
    pub bit_flips: bool,
    /// A member restarts on a record damaged beyond one bit; refused, it is wiped and
    /// re-admitted (`disk_faults::damage`).
    pub damage: bool,
    /// The Raft log writes and syncs each change a drawn while after it (a server's
    /// writer thread), and the WAL syncs once a second (its writer's timer), so a power
    /// loss cuts either's unsynced tail and a WAL `fsync` may fail.
    pub lagging_io: bool,
    /// `RAFT.READMIT` is sent as a command line (`cmd::dispatch`), as an operator sends
    /// it, rather than through `Replication::raft_change`.
    pub readmit_command: bool,
    /// Faults that overlap (`overlap`).
    pub overlaps: bool,
    /// The feed's second worker, claims, `XPENDING` and blocking reads
    /// (`feed::claims`).
    pub claims: bool,
    /// A data dir that lost its Raft log and kept its identity file (`amnesia::lose_log`).
    pub lost_log: bool,
    /// Two faults of one kind at once (`doubled`).
    pub doubled: bool,
    /// A storage error or a crash in the middle of a membership change (`change_faults`).
    pub change_faults: bool,
    /// A leader whose Raft log syncs far behind the network loses the power and
    /// restarts at once (`slow_leader`).
    pub slow_leader: bool,
}

impl Kinds {
    /// The kinds `settings` asks for.
    pub fn of(settings: &crate::Settings) -> Kinds {
        Kinds {
            bit_flips: settings.bit_flips,
            damage: settings.damage,
            lagging_io: settings.lagging_io,
            readmit_command: settings.commands,
            overlaps: settings.overlaps,
            claims: settings.claims,
            lost_log: settings.lost_log,
            doubled: settings.doubled,
            change_faults: settings.change_faults,
            slow_leader: settings.slow_leader,
        }
    }

    /// How many of the drawn phase's kinds (of sixteen before these) a step draws from:
    /// the kinds after the sixteen, in order, are a flipped bit, a damaged record, the
    /// overlapping faults' three, a lost Raft log, two faults of one kind at once (two
    /// draws), a fault during a membership change and the slow leader's power loss.
    pub fn extra(&self) -> u32 {
        u32::from(self.bit_flips)
            + u32::from(self.damage)
            + 3 * u32::from(self.overlaps)
            + u32::from(self.lost_log)
            + 2 * u32::from(self.doubled)
            + u32::from(self.change_faults)
            + u32::from(self.slow_leader)
    }
}
