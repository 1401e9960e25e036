//! One REST budget for a fleet (CONTRACT §9): which host's poller does what. In a fleet, the
//! demand poll and stale checks of a target run on one host at a time, the holder of the leader
//! lease [`role`] (`poll:<target>`), and so does the App's failed-delivery scan ([`SCAN_ROLE`]:
//! the hook log and its cursor are the App's, not a target's). Every step of every poller asks
//! for each of its roles with `Fleet::try_lead` (renewing those it holds, [`LEAD_TTL`]); a host
//! that does not lead a role sends none of its requests but keeps its own state, and takes the
//! role over once the leader stops renewing. A poller without a fleet is alone: it does
//! everything, on its own schedule, as before.
//!
//! What a step does with the election's answers is decided here, purely ([`works_now`],
//! [`demand`]); the poller asks the fleet and acts.

use std::time::Duration;

use rm_github::Target;

use super::schedule::STATUS_REFRESH;

/// How long a poller's lead on a role lasts without renewal. Every step renews it, and the loop
/// steps at least every [`STATUS_REFRESH`] (30 s), so four renewals fit in one lease (two
/// default poll intervals): a slow step or a database hiccup does not hand the role over, and a
/// host that stopped is replaced within this plus one step. A lead that lapses during a very long
/// step (a pass paced by the rate limit) costs at most that pass's requests twice: a sighting
/// merges forward only, whoever sends it.
pub(crate) const LEAD_TTL: Duration = Duration::from_secs(4 * STATUS_REFRESH.as_secs());

/// The role of the App's failed-delivery scan (one hook log and one cursor for the fleet).
pub(crate) const SCAN_ROLE: &str = "poll:hook_deliveries";

/// The role whose holder polls `target`: `poll:<target>`, lowercased (GitHub's names are
/// case-insensitive, and two hosts may spell a target differently).
pub(crate) fn role(target: &Target) -> String {
    format!("poll:{}", target.to_string().to_ascii_lowercase())
}

/// Where this host stands on one role in this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// No fleet: this host does everything.
    Alone,
    /// This host holds the role; `took_over` in the step it got it.
    Leads { took_over: bool },
    /// Another host holds it.
    Follows,
}

impl Standing {
    /// The election's answer for a role, given whether this host held it after the last step.
    pub(crate) fn elected(leads: bool, led_before: bool) -> Standing {
        match (leads, led_before) {
            (false, _) => Standing::Follows,
            (true, before) => Standing::Leads { took_over: !before },
        }
    }
}

/// Whether this host does a role's work in this step, given whether its own schedule says the
/// work is due: alone or leading, when scheduled; a leader also at once in the step it took the
/// role over (its follower's schedule may be idle, and the host before it stopped at least a
/// lease ago); a follower never.
pub(crate) fn works_now(standing: Standing, scheduled: bool) -> bool {
    match standing {
        Standing::Alone => scheduled,
        Standing::Leads { took_over } => scheduled || took_over,
        Standing::Follows => false,
    }
}

/// The demand poll of one step: the targets this host polls (those it is alone on or leads, in
/// the configured order) and whether the demand poll runs now (the schedule says so, or a target
/// was taken over). `standings` has one entry per target. A due poll with no target left still
/// runs, empty, so the schedule moves on and the loop does not wake at once again.
pub(crate) fn demand(
    targets: &[Target],
    standings: &[Standing],
    scheduled: bool,
) -> (Vec<Target>, bool) {
    let mine: Vec<Target> = targets
        .iter()
        .zip(standings)
        .filter(|(_, standing)| **standing != Standing::Follows)
        .map(|(target, _)| target.clone())
        .collect();
    let took_over = standings
        .iter()
        .any(|standing| matches!(standing, Standing::Leads { took_over: true }));
    (mine, scheduled || took_over)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> Vec<Target> {
        ["acme", "acme/widgets", "other"]
            .iter()
            .map(|t| t.parse().unwrap())
            .collect()
    }

    #[test]
    fn a_role_is_named_after_its_target_in_any_case() {
        let target: Target = "Acme/Widgets".parse().unwrap();
        assert_eq!(role(&target), "poll:acme/widgets");
        assert_eq!(role(&"ACME".parse().unwrap()), "poll:acme");
        assert_ne!(role(&"acme".parse().unwrap()), SCAN_ROLE);
    }

    #[test]
    fn the_election_s_answer_says_whether_the_role_was_just_taken() {
        assert_eq!(Standing::elected(false, true), Standing::Follows);
        assert_eq!(Standing::elected(false, false), Standing::Follows);
        assert_eq!(
            Standing::elected(true, false),
            Standing::Leads { took_over: true }
        );
        assert_eq!(
            Standing::elected(true, true),
            Standing::Leads { took_over: false }
        );
    }

    #[test]
    fn alone_or_leading_a_host_works_on_schedule_and_a_follower_never() {
        for scheduled in [false, true] {
            assert_eq!(works_now(Standing::Alone, scheduled), scheduled);
            let leads = Standing::Leads { took_over: false };
            assert_eq!(works_now(leads, scheduled), scheduled);
            assert!(!works_now(Standing::Follows, scheduled));
        }
        // Taking a role over: its work at once, whatever this host's schedule says.
        assert!(works_now(Standing::Leads { took_over: true }, false));
    }

    #[test]
    fn a_host_polls_the_targets_it_leads_and_at_once_those_it_took_over() {
        let all = targets();
        let alone = [Standing::Alone; 3];
        assert_eq!(demand(&all, &alone, true), (all.clone(), true));
        assert_eq!(demand(&all, &alone, false), (all.clone(), false));

        let held = Standing::Leads { took_over: false };
        let split = [held, Standing::Follows, held];
        let (mine, due) = demand(&all, &split, false);
        assert_eq!(mine, vec![all[0].clone(), all[2].clone()]);
        assert!(!due, "nothing taken over: the schedule decides");

        let taken = [Standing::Follows, Standing::Leads { took_over: true }, held];
        let (mine, due) = demand(&all, &taken, false);
        assert_eq!(mine, vec![all[1].clone(), all[2].clone()]);
        assert!(due, "a target taken over is polled at once");

        let (mine, due) = demand(&all, &[Standing::Follows; 3], true);
        assert!(mine.is_empty(), "a follower polls nothing");
        assert!(due, "but its schedule moves on");
    }
}
