//! How the requests a worker's budget (`outbox.max_requests_in_flight`) leaves are shared
//! between the endpoints that want to claim, so that the claim statement only has to weigh
//! bytes.

/// How many deliveries each endpoint may claim, given how many each wants, which of them have
/// nothing in flight on this worker (`idle`), how many requests the budget leaves, and how
/// many of those to keep back for enabled endpoints that have nothing in flight and are not
/// in this claim (`reserve`).
///
/// The rule is that every endpoint either has a request in flight or finds one free. So an
/// endpoint with nothing in flight gets one request first; only what is left after those and
/// the reserve goes in equal shares, with what an endpoint wants less than its share going to
/// the others and the few left over from the division one each to the endpoints counted from
/// `first` on. Endpoints that hang therefore hold at most one request each beyond what the
/// others need, and one that answers is never left without a request to send with. (With
/// fewer requests than idle endpoints, the requests go one each from `first` on; the caller
/// moves `first` from claim to claim, so no endpoint is passed over for good.)
pub fn share_requests(wanted: &[usize], idle: &[bool], budget: usize, reserve: usize, first: usize) -> Vec<usize> {
    let n = wanted.len();
    if wanted.iter().sum::<usize>() + reserve <= budget {
        return wanted.to_vec();
    }
    let mut given = vec![0; n];
    let mut left = budget;
    for i in (0..n).map(|k| (first + k) % n) {
        if left > 0 && idle[i] && wanted[i] > 0 {
            given[i] = 1;
            left -= 1;
        }
    }
    let still_wanted: Vec<usize> = wanted.iter().zip(&given).map(|(w, g)| w - g).collect();
    let shares = equal_shares(&still_wanted, left.saturating_sub(reserve), first);
    given.iter().zip(shares).map(|(g, s)| g + s).collect()
}

/// `budget` in equal shares; what an endpoint wants less than its share goes to the others, and
/// what the division leaves over one each from `first` on.
fn equal_shares(wanted: &[usize], budget: usize, first: usize) -> Vec<usize> {
    let n = wanted.len();
    let mut given = vec![0; n];
    // Smallest wants first: those below an equal share of what is left get what they want;
    // from the first that wants more, all the rest get that share.
    let mut by_want: Vec<usize> = (0..n).collect();
    by_want.sort_by_key(|&i| wanted[i]);
    let mut left = budget;
    for (place, &i) in by_want.iter().enumerate() {
        let share = left / (n - place);
        if wanted[i] > share {
            for &rest in &by_want[place..] {
                given[rest] = share;
            }
            left -= share * (n - place);
            break;
        }
        given[i] = wanted[i];
        left -= wanted[i];
    }
    for i in (0..n).map(|k| (first + k) % n) {
        if left == 0 {
            break;
        }
        if given[i] < wanted[i] {
            given[i] += 1;
            left -= 1;
        }
    }
    given
}

#[cfg(test)]
mod tests {
    use super::share_requests;

    fn busy(n: usize) -> Vec<bool> {
        vec![false; n]
    }

    #[test]
    fn what_fits_with_the_reserve_is_given_whole() {
        assert_eq!(share_requests(&[100, 50, 3], &busy(3), 256, 0, 0), vec![100, 50, 3]);
        assert_eq!(share_requests(&[100, 50, 3], &busy(3), 156, 3, 0), vec![100, 50, 3]);
    }

    #[test]
    fn equal_shares_of_what_is_left_and_what_one_does_not_want_goes_to_the_others() {
        assert_eq!(share_requests(&[100, 100, 100], &busy(3), 90, 0, 0), vec![30, 30, 30]);
        assert_eq!(share_requests(&[100, 10, 100], &busy(3), 90, 0, 0), vec![40, 10, 40]);
        // 91 requests, 1 kept back, 90 shared; 92: the odd one from first on.
        assert_eq!(share_requests(&[100, 100], &busy(2), 91, 1, 1), vec![45, 45]);
        assert_eq!(share_requests(&[100, 100], &busy(2), 92, 1, 1), vec![45, 46]);
    }

    #[test]
    fn endpoints_with_nothing_in_flight_get_one_each_before_the_others_share() {
        let idle = [true, false, true];
        assert_eq!(share_requests(&[100, 100, 100], &idle, 10, 0, 0), vec![4, 3, 3]);
        assert_eq!(share_requests(&[1, 100, 100], &idle, 10, 2, 0), vec![1, 3, 4]);
    }

    #[test]
    fn two_hundred_endpoints_that_hang_leave_the_request_kept_for_one_that_answers() {
        // A fresh worker: 200 endpoints claim, one more has nothing to send yet.
        let given = share_requests(&[100; 200], &[true; 200], 256, 1, 7);
        assert!(given.iter().all(|&g| g >= 1));
        assert_eq!(given.iter().sum::<usize>(), 255);
        // The other worker claimed 120 of them first: the 80 left idle here get one each
        // before the 120 take the rest, and the healthy endpoint's request is still kept.
        let idle: Vec<bool> = (0..200).map(|i| i >= 120).collect();
        let wanted: Vec<usize> = (0..200).map(|i| if i < 120 { 1 } else { 2 }).collect();
        let given = share_requests(&wanted, &idle, 256 - 120, 1, 3);
        assert!(given[120..].iter().all(|&g| g >= 1), "{given:?}");
        assert_eq!(given.iter().sum::<usize>(), 135);
    }

    #[test]
    fn with_fewer_requests_than_idle_endpoints_each_turn_serves_the_next_ones() {
        let wanted = vec![100; 5];
        assert_eq!(share_requests(&wanted, &[true; 5], 2, 0, 0), vec![1, 1, 0, 0, 0]);
        assert_eq!(share_requests(&wanted, &[true; 5], 2, 0, 4), vec![1, 0, 0, 0, 1]);
    }

    #[test]
    fn never_more_than_the_budget_less_the_reserve_nor_than_an_endpoint_wants() {
        let wanted = [0, 1, 5, 9, 17, 3, 100];
        let idle = [true, true, false, true, false, false, true];
        let idle_wanting = 3;
        for budget in 0..40 {
            for reserve in 0..5 {
                for first in 0..7 {
                    let given = share_requests(&wanted, &idle, budget, reserve, first);
                    let total: usize = wanted.iter().sum();
                    let expected = if total + reserve <= budget {
                        total
                    } else {
                        budget.min(idle_wanting) + budget.saturating_sub(idle_wanting).saturating_sub(reserve)
                    };
                    assert_eq!(given.iter().sum::<usize>(), expected, "budget {budget}, reserve {reserve}");
                    assert!(given.iter().zip(wanted).all(|(g, w)| *g <= w));
                }
            }
        }
    }
}
