//! A rerun seed's trace of what each node told (applied, kept, held,
//! settled, released or reverted, conflicts), printed as it happens.

use super::*;

impl Sim {
    /// Prints what `node` told since its audit log's `audit_before`th event.
    pub(crate) fn trace_told(&self, node: usize, audit_before: usize) {
        let n = &self.nodes[node];
        for event in &n.audit[audit_before..] {
            match event {
                node::Event::Applied { decision, from, .. } => {
                    trace!(self, "{} applies {} {} via {from}", n.name, decision.id, decision.version)
                }
                node::Event::Kept { decision, from, shows, wrote, .. } => trace!(
                    self,
                    "{} keeps {} {} via {from}: shows {:?}, wrote {wrote}",
                    n.name,
                    decision.id,
                    decision.version,
                    shows.as_ref().map(|s| s.version.to_string())
                ),
                _ => {}
            }
            match event {
                node::Event::DeletesHeld { via: origin, n: count, .. } => {
                    trace!(self, "{} holds {count} deletes from {origin}", n.name)
                }
                node::Event::HeldSettled { held, how } => {
                    trace!(self, "{} settles held {} {}: {how:?}", n.name, held.decision.id, held.decision.version)
                }
                node::Event::PutBack { held, .. } => {
                    trace!(
                        self,
                        "{} puts back {} (holds {} from {})",
                        n.name,
                        held.decision.id,
                        held.decision.version,
                        held.from
                    )
                }
                node::Event::Operator { action, decision, .. } => {
                    trace!(self, "{} {action:?}s {} as {}", n.name, decision.id, decision.version)
                }
                _ => {}
            }
            if let node::Event::Conflict { conflict, from } = event {
                trace!(
                    self,
                    "{} tells conflict on {} via {from}: {} beats {}",
                    n.name,
                    conflict.id,
                    conflict.winner.version,
                    conflict.loser.version
                );
            }
        }
        if !n.store.untold.is_empty() {
            trace!(self, "{} keeps {} conflicts untold", n.name, n.store.untold.len());
        }
    }
}
