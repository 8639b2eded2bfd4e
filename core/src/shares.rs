//! How the requests a worker's budget (`outbox.max_requests_in_flight`) leaves are shared
//! between the endpoints that want to claim, so that the claim statement only has to weigh
//! bytes.

/// How many deliveries each endpoint may claim, given how many each wants and how many
/// requests the budget leaves: all they want if that fits. Otherwise one share is kept back
/// for an endpoint that has nothing in flight yet (as the worker's per-endpoint slots keep
/// one), so that endpoints which hang cannot take the whole budget from one that answers;
/// the rest goes in equal shares, with what an endpoint wants less than its share going to
/// the others, and the few left over from the division (or, with more endpoints than
/// requests, the requests themselves) one each to the endpoints counted from `first` on. The
/// caller moves `first` from claim to claim, so no endpoint is passed over for good.
pub fn share_requests(wanted: &[usize], budget: usize, first: usize) -> Vec<usize> {
    if wanted.iter().sum::<usize>() <= budget {
        return wanted.to_vec();
    }
    let n = wanted.len();
    let budget = budget - budget / (n + 1);
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

    #[test]
    fn what_fits_is_given_whole() {
        assert_eq!(share_requests(&[100, 50, 3], 256, 0), vec![100, 50, 3]);
    }

    #[test]
    fn equal_shares_of_what_is_left_after_one_kept_back_and_what_one_does_not_want_goes_to_the_others() {
        // 90 requests, 3 endpoints: 22 kept back, 68 shared.
        assert_eq!(share_requests(&[100, 100, 100], 90, 0), vec![23, 23, 22]);
        assert_eq!(share_requests(&[100, 10, 100], 90, 0), vec![29, 10, 29]);
        // 91 requests, 2 endpoints: 30 kept back, 61 shared, the odd one from first on.
        assert_eq!(share_requests(&[100, 100], 91, 1), vec![30, 31]);
    }

    #[test]
    fn two_hundred_endpoints_that_want_more_than_the_budget_leave_room_for_one_more() {
        let given = share_requests(&[100; 200], 256, 7);
        assert!(given.iter().all(|&g| g >= 1));
        assert_eq!(given.iter().sum::<usize>(), 255, "one request kept for an endpoint with nothing in flight");
    }

    #[test]
    fn with_more_endpoints_than_requests_each_turn_serves_the_next_ones() {
        let wanted = vec![100; 5];
        assert_eq!(share_requests(&wanted, 2, 0), vec![1, 1, 0, 0, 0]);
        assert_eq!(share_requests(&wanted, 2, 4), vec![1, 0, 0, 0, 1]);
    }

    #[test]
    fn never_more_than_the_budget_nor_than_an_endpoint_wants() {
        for budget in 0..40 {
            for first in 0..7 {
                let wanted = [0, 1, 5, 9, 17, 3, 100];
                let given = share_requests(&wanted, budget, first);
                let total: usize = wanted.iter().sum();
                let expected = if total <= budget { total } else { budget - budget / (wanted.len() + 1) };
                assert_eq!(given.iter().sum::<usize>(), expected, "budget {budget}");
                assert!(given.iter().zip(wanted).all(|(g, w)| *g <= w));
            }
        }
    }
}
